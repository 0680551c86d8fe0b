def halve(n):
    return n // 2


def to_seconds(hours, minutes):
    return hours * 3600 + minutes * 60
