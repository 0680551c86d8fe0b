def is_empty(items):
    return len(items) == 0


def discounted(price, percent):
    result = price - price * percent / 100
