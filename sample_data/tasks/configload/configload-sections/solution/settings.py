"""Load settings from simple 'key = value' files."""

DEFAULTS = {"host": "localhost", "port": 8080, "debug": False}


def parse(text):
    """'key = value' lines -> {key: value} strings; '#' starts a comment line."""
    settings, prefix = {}, ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            prefix = line[1:-1].strip() + "."
            continue
        key, value = line.split("=", 1)
        settings[prefix + key.strip()] = value.strip()
    return settings


def convert(value):
    """'8080' -> 8080, 'true'/'false' -> bool, anything else stays a string."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        return value


def load(text):
    """DEFAULTS, overridden by the settings in `text` (converted)."""
    config = dict(DEFAULTS)
    for key, value in parse(text).items():
        config[key] = convert(value)
    return config
