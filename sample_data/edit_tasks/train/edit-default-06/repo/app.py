def label(name):
    return name.upper()


def take(items, count=6):
    return items[:count]
