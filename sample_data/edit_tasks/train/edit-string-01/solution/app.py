def double(n):
    return n * 2


def denied(user):
    return f"Access denied for {user}"
