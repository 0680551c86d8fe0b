def describe(value):
    return f"<{value}>"


def average(values):
    return sum(values) / len(values)
