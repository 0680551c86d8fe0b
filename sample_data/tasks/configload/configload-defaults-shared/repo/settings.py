"""Load settings from simple 'key = value' files."""

DEFAULTS = {"host": "localhost", "port": 8080, "debug": False}


def parse(text):
    """'key = value' lines -> {key: value} strings; '#' starts a comment line."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        settings[key.strip()] = value.strip()
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
    config = DEFAULTS
    for key, value in parse(text).items():
        config[key] = convert(value)
    return config
