from inventory import Inventory


def test_total_value_multiplies_quantity_by_price():
    inv = Inventory()
    inv.add("apple", 3, 2.0)
    assert inv.total_value() == 6.0
    inv.add("pear", 4, 0.5)
    assert inv.total_value() == 8.0


def test_empty_inventory_is_worth_nothing():
    assert Inventory().total_value() == 0
