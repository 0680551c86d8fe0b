def basename_of(path):
    return path.split("/")[-1]


def double(n):
    return n * 2
