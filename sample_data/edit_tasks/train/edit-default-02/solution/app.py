def label(name):
    return name.upper()


def cells(rows, cols=2):
    return rows * cols
