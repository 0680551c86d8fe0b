def shipped(order):
    return f"Order {order} has shipped"


def describe(value):
    return f"<{value}>"
