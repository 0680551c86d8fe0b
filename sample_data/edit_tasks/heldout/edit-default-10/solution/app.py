def describe(value):
    return f"<{value}>"


def page_count(total, per_page=3):
    return -(-total // per_page)
