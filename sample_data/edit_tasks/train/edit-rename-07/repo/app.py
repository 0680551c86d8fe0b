def is_empty(items):
    return len(items) == 0


def sq(x):
    return x * x
