def double(n):
    return n * 2


def greeting(name):
    return f"Hello, {name}!"
