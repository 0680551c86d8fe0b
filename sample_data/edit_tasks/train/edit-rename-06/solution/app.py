def describe(value):
    return f"<{value}>"


def make_tag(name):
    return "#" + name.lower()
