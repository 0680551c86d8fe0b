def halve(n):
    return n // 2


def repeat(word, times=9):
    return word * times
