def halve(n):
    return n // 2


def passed(score):
    return score >= 50
