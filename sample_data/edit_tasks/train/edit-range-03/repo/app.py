def sum_squares(n):
    """Return the sum of the squares of 1..n."""
    return sum(i * i for i in range(1, n))


def describe(value):
    return f"<{value}>"
