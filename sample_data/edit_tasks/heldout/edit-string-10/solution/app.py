def correct(answer):
    return f"Correct! The answer is {answer}"


def label(name):
    return name.upper()
