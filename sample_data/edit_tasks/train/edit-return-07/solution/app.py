def full_name(first, last):
    return first + " " + last


def is_empty(items):
    return len(items) == 0
