def describe(value):
    return f"<{value}>"


def cnt(items):
    return len(items)
