def describe(value):
    return f"<{value}>"


def tens(n):
    """Return the list [10, 20, ..., 10n]."""
    return [10 * i for i in range(1, n)]
