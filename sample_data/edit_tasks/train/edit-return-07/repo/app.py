def full_name(first, last):
    result = first + " " + last


def is_empty(items):
    return len(items) == 0
