def describe(value):
    return f"<{value}>"


def count_items(items):
    return len(items)
