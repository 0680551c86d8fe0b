from settings import load


def test_env_overrides_file_and_defaults():
    config = load("port = 1\nhost = a", env={"APP_PORT": "9000", "APP_DEBUG": "true"})
    assert config["port"] == 9000
    assert config["debug"] is True
    assert config["host"] == "a"


def test_unprefixed_names_are_ignored():
    assert load("", env={"PORT": "1", "port": "2"})["port"] == 8080
