from datetime import date

import pytest

from dates import format_date


def test_long_style():
    assert format_date(date(2024, 3, 5), "long") == "5 March 2024"
    assert format_date(date(1999, 12, 31), "long") == "31 December 1999"


def test_unknown_style_still_fails():
    with pytest.raises(ValueError):
        format_date(date(2024, 3, 5), "short")
