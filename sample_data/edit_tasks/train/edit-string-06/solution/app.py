def welcome(user):
    return f"Welcome back, {user}"


def halve(n):
    return n // 2
