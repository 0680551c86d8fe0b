"""Descriptive statistics for lists of numbers."""


def mean(values):
    return sum(values) / len(values)


def median(values):
    ordered = values
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def mode(values):
    """The most common value; the smallest of them on a tie."""
    counts = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def variance(values):
    """Population variance: the mean squared distance from the mean."""
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
