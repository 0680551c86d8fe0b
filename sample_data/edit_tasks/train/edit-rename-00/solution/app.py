def username(email):
    return email.split("@")[0]


def first(items):
    return items[0]
