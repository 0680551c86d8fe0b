from dates import business_days_between


def test_full_week():
    assert business_days_between("2024-01-01", "2024-01-08") == 5


def test_weekend_only():
    assert business_days_between("2024-01-06", "2024-01-08") == 0


def test_friday_to_monday():
    assert business_days_between("01/05/2024", "2024-01-08") == 1


def test_not_after():
    assert business_days_between("2024-01-08", "2024-01-01") == 0
    assert business_days_between("2024-01-08", "2024-01-08") == 0
