def describe(value):
    return f"<{value}>"


def minutes(seconds, unit=6):
    return seconds // unit
