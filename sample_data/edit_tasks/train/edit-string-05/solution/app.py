def halve(n):
    return n // 2


def failure(path):
    return f"Error: cannot open {path}"
