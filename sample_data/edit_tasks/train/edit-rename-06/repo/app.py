def describe(value):
    return f"<{value}>"


def mk_tag(name):
    return "#" + name.lower()
