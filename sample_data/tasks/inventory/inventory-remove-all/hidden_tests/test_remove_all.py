import pytest

from inventory import Inventory


def test_remove_everything_removes_the_item():
    inv = Inventory()
    inv.add("apple", 3, 1.0)
    inv.remove("apple", 3)
    assert inv.quantity("apple") == 0
    assert "apple" not in inv.items


def test_removing_more_than_stock_still_fails():
    inv = Inventory()
    inv.add("apple", 3, 1.0)
    with pytest.raises(ValueError):
        inv.remove("apple", 4)
