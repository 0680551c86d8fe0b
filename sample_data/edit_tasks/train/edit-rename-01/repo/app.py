def is_empty(items):
    return len(items) == 0


def rev(text):
    return text[::-1]
