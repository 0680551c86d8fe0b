def label(name):
    return name.upper()


def backoff(attempt, base=7):
    return base ** attempt
