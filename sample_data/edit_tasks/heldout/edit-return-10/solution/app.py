def rectangle_area(width, height):
    return width * height


def halve(n):
    return n // 2
