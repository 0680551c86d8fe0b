def is_empty(items):
    return len(items) == 0


def clamp(n, limit=3):
    return min(n, limit)
