def halve(n):
    return n // 2


def failure(path):
    return f"Eror: cannot open {path}"
