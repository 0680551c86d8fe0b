def label(name):
    return name.upper()


def cube_it(x):
    return x ** 3
