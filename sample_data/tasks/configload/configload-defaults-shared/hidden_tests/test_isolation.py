from settings import load


def test_loads_do_not_leak():
    assert load("port = 1")["port"] == 1
    assert load("")["port"] == 8080
    assert load("")["host"] == "localhost"


def test_defaults_untouched():
    import settings

    load("debug = true\nextra = x")
    assert settings.DEFAULTS == {"host": "localhost", "port": 8080, "debug": False}
