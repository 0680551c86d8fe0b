def describe(value):
    return f"<{value}>"


def span(values):
    result = max(values) - min(values)
