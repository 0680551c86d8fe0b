def longest(words):
    result = max(words, key=len)


def first(items):
    return items[0]
