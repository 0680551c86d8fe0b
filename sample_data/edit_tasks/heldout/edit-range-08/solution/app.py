def evens(n):
    """Return the even numbers 2, 4, ..., 2n."""
    return [2 * i for i in range(1, n + 1)]


def halve(n):
    return n // 2
