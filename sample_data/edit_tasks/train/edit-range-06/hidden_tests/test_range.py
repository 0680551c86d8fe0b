from app import labels


def test_includes_n():
    assert labels(4) == ['item1', 'item2', 'item3', 'item4']
    assert labels(1) == ['item1']
