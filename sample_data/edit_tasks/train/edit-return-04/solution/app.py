def describe(value):
    return f"<{value}>"


def span(values):
    return max(values) - min(values)
