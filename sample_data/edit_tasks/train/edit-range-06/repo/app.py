def labels(n):
    """Return the labels 'item1' ... 'itemn'."""
    return [f"item{i}" for i in range(1, n)]


def halve(n):
    return n // 2
