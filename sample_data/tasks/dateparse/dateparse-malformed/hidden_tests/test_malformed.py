import pytest

from dates import parse_date


@pytest.mark.parametrize("text", ["2024-03", "", "a-b-c", "1/2", "2024-13-01", "31.12.2024"])
def test_malformed_dates(text):
    with pytest.raises(ValueError, match=r"^invalid date: "):
        parse_date(text)


def test_good_dates_still_parse():
    assert parse_date("2024-03-31").day == 31
