from app import saved


def test_saved_text():
    assert saved("X") == 'X was saved'
