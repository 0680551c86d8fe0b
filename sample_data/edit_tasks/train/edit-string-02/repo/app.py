def shipped(order):
    return f"Order {order} has shiped"


def describe(value):
    return f"<{value}>"
