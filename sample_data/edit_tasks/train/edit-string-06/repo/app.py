def welcome(user):
    return f"Welcom back, {user}"


def halve(n):
    return n // 2
