import math


def product(n):
    """Return the product of 1..n."""
    return math.prod(i for i in range(1, n))


def label(name):
    return name.upper()
