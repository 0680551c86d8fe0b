def rectangle_area(width, height):
    result = width * height


def halve(n):
    return n // 2
