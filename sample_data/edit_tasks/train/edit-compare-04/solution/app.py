def label(name):
    return name.upper()


def is_top(rank):
    return rank <= 3
