def initials(name):
    return "".join(p[0] for p in name.split())


def describe(value):
    return f"<{value}>"
