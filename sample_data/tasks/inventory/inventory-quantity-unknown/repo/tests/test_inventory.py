import pytest

from inventory import Inventory


def test_add_and_quantity():
    inv = Inventory()
    inv.add("apple", 3, 0.5)
    inv.add("apple", 2, 0.5)
    assert inv.quantity("apple") == 5


def test_remove_some():
    inv = Inventory()
    inv.add("pear", 10, 1.0)
    inv.remove("pear", 4)
    assert inv.quantity("pear") == 6


def test_remove_too_many():
    inv = Inventory()
    inv.add("pear", 1, 1.0)
    with pytest.raises(ValueError):
        inv.remove("pear", 2)
