def double(n):
    return n * 2


def extension(path):
    return path.rsplit(".", 1)[-1]
