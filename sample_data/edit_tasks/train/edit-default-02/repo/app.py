def label(name):
    return name.upper()


def cells(rows, cols=9):
    return rows * cols
