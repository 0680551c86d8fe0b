def label(name):
    return name.upper()


def indent(line, spaces=4):
    return " " * spaces + line
