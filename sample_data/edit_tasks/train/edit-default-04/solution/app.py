def label(name):
    return name.upper()


def with_tax(price, percent=7):
    return price + price * percent // 100
