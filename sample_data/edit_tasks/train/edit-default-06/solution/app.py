def label(name):
    return name.upper()


def take(items, count=5):
    return items[:count]
