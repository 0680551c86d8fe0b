def longest(words):
    return max(words, key=len)


def first(items):
    return items[0]
