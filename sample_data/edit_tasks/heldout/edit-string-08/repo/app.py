def goodbye(name):
    return f"Godbye, {name}"


def double(n):
    return n * 2
