def label(name):
    return name.upper()


def without_none(items):
    return [x for x in items if x is not None]
