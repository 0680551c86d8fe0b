from settings import load, parse


def test_sections_prefix_keys():
    text = "name = app\n[db]\nport = 5432\nhost = db.local\n[cache]\nport = 6379\n"
    assert parse(text) == {"name": "app", "db.port": "5432", "db.host": "db.local", "cache.port": "6379"}


def test_load_with_sections():
    config = load("port = 1\n[db]\nport = 5432")
    assert config["port"] == 1
    assert config["db.port"] == 5432
