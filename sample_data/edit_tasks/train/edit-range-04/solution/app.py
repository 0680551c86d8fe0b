def halve(n):
    return n // 2


def triangle(n):
    """Return the n-th triangle number."""
    return sum(i for i in range(1, n + 1))
