def cents(euros):
    result = round(euros * 100)


def describe(value):
    return f"<{value}>"
