import pytest

from inventory import Inventory


def make():
    inv = Inventory()
    inv.add("lamp", 2, 50.0)
    return inv


def test_percentage_discount():
    assert make().total_value(discount_pct=15) == pytest.approx(85.0)
    assert make().total_value(discount_pct=100) == pytest.approx(0.0)


def test_no_discount_by_default():
    assert make().total_value() == pytest.approx(100.0)


def test_out_of_range():
    with pytest.raises(ValueError):
        make().total_value(discount_pct=120)
    with pytest.raises(ValueError):
        make().total_value(discount_pct=-5)
