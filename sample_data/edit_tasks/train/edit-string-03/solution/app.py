def label(name):
    return name.upper()


def warn(item):
    return f"Warning: {item} is low"
