def is_boiling(celsius):
    return celsius >= 100


def label(name):
    return name.upper()
