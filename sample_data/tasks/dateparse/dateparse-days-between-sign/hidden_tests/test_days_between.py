from dates import days_between


def test_forward_is_positive():
    assert days_between("2024-01-01", "2024-01-31") == 30


def test_backward_is_negative():
    assert days_between("2024-03-01", "2024-02-28") == -2


def test_same_day():
    assert days_between("2024-05-05", "05/05/2024") == 0
