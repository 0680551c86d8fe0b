"""Load settings from simple 'key = value' files."""
import os

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


def load(text, env=None):
    """DEFAULTS, overridden by the settings in `text`, then by APP_<KEY> variables of env."""
    env = os.environ if env is None else env
    config = dict(DEFAULTS)
    for key, value in parse(text).items():
        config[key] = convert(value)
    for key in list(config):
        name = "APP_" + key.upper()
        if name in env:
            config[key] = convert(env[name])
    return config
