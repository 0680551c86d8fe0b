def thanks(buyer):
    return f"Thanks for your order, {buyer}"


def first(items):
    return items[0]
