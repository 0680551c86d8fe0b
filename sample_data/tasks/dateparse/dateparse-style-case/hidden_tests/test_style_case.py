from datetime import date

import pytest

from dates import format_date


def test_upper_case_styles():
    assert format_date(date(2024, 3, 5), "US") == "03/05/2024"
    assert format_date(date(2024, 3, 5), "Iso") == "2024-03-05"


def test_unknown_style_still_fails():
    with pytest.raises(ValueError):
        format_date(date(2024, 3, 5), "Long")
