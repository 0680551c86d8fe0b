def double(n):
    return n * 2


def is_freezing(celsius):
    return celsius <= 0
