def halve(n):
    return n // 2


def repeat(word, times=7):
    return word * times
