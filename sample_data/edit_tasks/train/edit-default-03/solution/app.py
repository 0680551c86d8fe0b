def shift(n, offset=2):
    return n + offset


def double(n):
    return n * 2
