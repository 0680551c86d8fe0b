def km_to_miles(km):
    result = km * 0.621


def first(items):
    return items[0]
