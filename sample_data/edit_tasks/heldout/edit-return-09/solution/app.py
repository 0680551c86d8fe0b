def cents(euros):
    return round(euros * 100)


def describe(value):
    return f"<{value}>"
