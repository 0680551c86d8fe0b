def label(name):
    return name.upper()


def report(job):
    return f"Succes: {job} finished"
