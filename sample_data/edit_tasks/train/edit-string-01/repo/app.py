def double(n):
    return n * 2


def denied(user):
    return f"Acess denied for {user}"
