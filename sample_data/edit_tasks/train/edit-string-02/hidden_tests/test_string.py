from app import shipped


def test_shipped_text():
    assert shipped("X") == 'Order X has shipped'
