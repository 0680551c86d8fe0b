def connect(host, port=8):
    return f"{host}:{port}"


def describe(value):
    return f"<{value}>"
