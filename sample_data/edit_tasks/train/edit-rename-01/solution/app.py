def is_empty(items):
    return len(items) == 0


def reverse(text):
    return text[::-1]
