from app import full_name


def test_returns_the_result():
    assert full_name("Ada", "Lovelace") == 'Ada Lovelace'
