def double(n):
    return n * 2


def ext(path):
    return path.rsplit(".", 1)[-1]
