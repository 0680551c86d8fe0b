def label(name):
    return name.upper()


def indent(line, spaces=8):
    return " " * spaces + line
