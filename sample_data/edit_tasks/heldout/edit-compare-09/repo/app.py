def is_empty(items):
    return len(items) == 0


def is_speeding(kmh):
    return kmh >= 50
