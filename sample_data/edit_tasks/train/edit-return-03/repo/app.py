def halve(n):
    return n // 2


def to_seconds(hours, minutes):
    result = hours * 3600 + minutes * 60
