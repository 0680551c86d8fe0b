def is_empty(items):
    return len(items) == 0


def discounted(price, percent):
    return price - price * percent / 100
