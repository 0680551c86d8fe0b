def sum_cubes(n):
    """Return the sum of the cubes of 1..n."""
    return sum(i ** 3 for i in range(1, n))


def label(name):
    return name.upper()
