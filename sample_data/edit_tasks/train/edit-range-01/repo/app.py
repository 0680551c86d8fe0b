def total(n):
    """Return the sum of 1..n."""
    return sum(i for i in range(1, n))


def is_empty(items):
    return len(items) == 0
