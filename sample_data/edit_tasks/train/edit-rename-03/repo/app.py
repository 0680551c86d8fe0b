def describe(value):
    return f"<{value}>"


def calc_total(prices):
    return sum(prices)
