def is_empty(items):
    return len(items) == 0


def is_low(percent):
    return percent < 20
