def shout(message):
    result = message.upper() + "!"


def halve(n):
    return n // 2
