import pytest

from inventory import Inventory


def test_weighted_average_price():
    inv = Inventory()
    inv.add("apple", 2, 1.0)
    inv.add("apple", 2, 2.0)
    assert inv.items["apple"] == (4, pytest.approx(1.5))
    assert inv.total_value() == pytest.approx(6.0)


def test_uneven_quantities():
    inv = Inventory()
    inv.add("pear", 3, 1.0)
    inv.add("pear", 1, 5.0)
    assert inv.total_value() == pytest.approx(8.0)
