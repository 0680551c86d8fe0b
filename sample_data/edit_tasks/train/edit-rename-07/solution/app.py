def is_empty(items):
    return len(items) == 0


def square(x):
    return x * x
