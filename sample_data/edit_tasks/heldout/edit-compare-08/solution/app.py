def has_quorum(present):
    return present >= 12


def double(n):
    return n * 2
