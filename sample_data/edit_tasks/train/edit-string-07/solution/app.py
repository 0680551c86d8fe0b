def first(items):
    return items[0]


def closed(shop):
    return f"{shop} is closed today"
