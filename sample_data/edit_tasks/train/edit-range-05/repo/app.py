def sum_halves(n):
    """Return the sum of i / 2 for i in 1..n."""
    return sum(i / 2 for i in range(1, n))


def describe(value):
    return f"<{value}>"
