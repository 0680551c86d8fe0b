def shout(message):
    return message.upper() + "!"


def halve(n):
    return n // 2
