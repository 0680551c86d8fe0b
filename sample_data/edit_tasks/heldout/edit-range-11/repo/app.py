def first(items):
    return items[0]


def sum_powers(n):
    """Return the sum of 2 ** i for i in 1..n."""
    return sum(2 ** i for i in range(1, n))
