def label(name):
    return name.upper()


def cube(x):
    return x ** 3
