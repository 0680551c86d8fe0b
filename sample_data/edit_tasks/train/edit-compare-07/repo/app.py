def is_adult(age):
    return age > 18


def halve(n):
    return n // 2
