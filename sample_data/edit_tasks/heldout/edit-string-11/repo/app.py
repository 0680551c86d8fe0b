def thanks(buyer):
    return f"Thnaks for your order, {buyer}"


def first(items):
    return items[0]
