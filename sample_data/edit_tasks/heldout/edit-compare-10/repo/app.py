def needs_reorder(count):
    return count < 5


def label(name):
    return name.upper()
