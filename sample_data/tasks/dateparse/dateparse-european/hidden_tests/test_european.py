from datetime import date

from dates import parse_date


def test_dayfirst():
    assert parse_date("03/04/2024", dayfirst=True) == date(2024, 4, 3)
    assert parse_date("31/12/2024", dayfirst=True) == date(2024, 12, 31)


def test_default_stays_us():
    assert parse_date("03/04/2024") == date(2024, 3, 4)


def test_iso_either_way():
    assert parse_date("2024-04-03", dayfirst=True) == date(2024, 4, 3)
