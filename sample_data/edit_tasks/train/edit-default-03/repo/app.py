def shift(n, offset=9):
    return n + offset


def double(n):
    return n * 2
