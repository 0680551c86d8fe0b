def goodbye(name):
    return f"Goodbye, {name}"


def double(n):
    return n * 2
