def label(name):
    return name.upper()


def backoff(attempt, base=8):
    return base ** attempt
