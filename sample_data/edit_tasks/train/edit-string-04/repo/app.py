def double(n):
    return n * 2


def saved(file):
    return f"{file} was savd"
