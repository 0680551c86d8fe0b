def double(n):
    return n * 2


def pad(text, width=4):
    return text.ljust(width)
