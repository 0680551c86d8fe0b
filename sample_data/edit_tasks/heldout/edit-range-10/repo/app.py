def is_empty(items):
    return len(items) == 0


def odds(n):
    """Return the odd numbers 1, 3, ..., 2n - 1."""
    return [2 * i - 1 for i in range(1, n)]
