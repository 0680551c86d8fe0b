def connect(host, port=9):
    return f"{host}:{port}"


def describe(value):
    return f"<{value}>"
