from datetime import date

from dates import parse_date


def test_us_dates_are_month_first():
    assert parse_date("03/31/2024") == date(2024, 3, 31)
    assert parse_date("01/02/2024") == date(2024, 1, 2)
