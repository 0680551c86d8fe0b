def mean(values):
    return sum(values) / len(values)


def halve(n):
    return n // 2
