from inventory import Inventory


def test_default_threshold_is_five():
    inv = Inventory()
    inv.add("bolt", 4, 0.1)
    inv.add("nut", 5, 0.1)
    inv.add("gear", 1, 3.0)
    assert inv.low_stock() == ["bolt", "gear"]


def test_explicit_threshold():
    inv = Inventory()
    inv.add("bolt", 4, 0.1)
    assert inv.low_stock(threshold=3) == []
