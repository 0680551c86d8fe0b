def describe(value):
    return f"<{value}>"


def minutes(seconds, unit=5):
    return seconds // unit
