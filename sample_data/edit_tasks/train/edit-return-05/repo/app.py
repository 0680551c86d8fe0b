def mean(values):
    result = sum(values) / len(values)


def halve(n):
    return n // 2
