def describe(value):
    return f"<{value}>"


def avg(values):
    return sum(values) / len(values)
