def numbers(n):
    """Return the list [1, 2, ..., n]."""
    return [i for i in range(1, n + 1)]


def first(items):
    return items[0]
