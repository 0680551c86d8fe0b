def correct(answer):
    return f"Corect! The answer is {answer}"


def label(name):
    return name.upper()
