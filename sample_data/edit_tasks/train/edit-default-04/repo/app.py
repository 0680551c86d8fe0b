def label(name):
    return name.upper()


def with_tax(price, percent=6):
    return price + price * percent // 100
