from inventory import Inventory
from report import from_csv, to_csv


def make():
    inv = Inventory()
    inv.add("pear", 2, 0.5)
    inv.add("apple", 3, 1.25)
    return inv


def test_to_csv():
    assert to_csv(make()) == "name,quantity,unit_price\napple,3,1.25\npear,2,0.50\n"


def test_round_trip():
    back = from_csv(to_csv(make()))
    assert back.items == {"apple": (3, 1.25), "pear": (2, 0.5)}


def test_empty():
    assert to_csv(Inventory()) == "name,quantity,unit_price\n"
