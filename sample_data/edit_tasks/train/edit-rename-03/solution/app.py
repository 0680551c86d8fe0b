def describe(value):
    return f"<{value}>"


def compute_total(prices):
    return sum(prices)
