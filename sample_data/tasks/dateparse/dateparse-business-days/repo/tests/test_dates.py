from datetime import date

from dates import format_date, parse_date


def test_parse_iso():
    assert parse_date("2024-03-31") == date(2024, 3, 31)


def test_format_iso():
    assert format_date(date(2024, 3, 5)) == "2024-03-05"


def test_format_us():
    assert format_date(date(2024, 3, 5), "us") == "03/05/2024"
