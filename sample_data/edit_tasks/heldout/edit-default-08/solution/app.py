def double(n):
    return n * 2


def pad(text, width=3):
    return text.ljust(width)
