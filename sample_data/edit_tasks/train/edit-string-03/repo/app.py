def label(name):
    return name.upper()


def warn(item):
    return f"Warnnig: {item} is low"
