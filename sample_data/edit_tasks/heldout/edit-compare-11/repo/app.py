def describe(value):
    return f"<{value}>"


def has_room(length):
    return length <= 10
