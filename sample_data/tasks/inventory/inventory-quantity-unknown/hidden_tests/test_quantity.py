from inventory import Inventory


def test_unknown_item_has_quantity_zero():
    assert Inventory().quantity("kiwi") == 0


def test_known_item():
    inv = Inventory()
    inv.add("kiwi", 2, 0.3)
    assert inv.quantity("kiwi") == 2
