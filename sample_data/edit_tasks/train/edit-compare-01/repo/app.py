def halve(n):
    return n // 2


def is_overdue(days):
    return days >= 30
