def first(items):
    return items[0]


def is_full(size):
    return size >= 100
