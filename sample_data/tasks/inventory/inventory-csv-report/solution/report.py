"""Inventory <-> CSV text."""
import csv
import io

from inventory import Inventory


def to_csv(inventory):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["name", "quantity", "unit_price"])
    for name in sorted(inventory.items):
        quantity, price = inventory.items[name]
        writer.writerow([name, quantity, f"{price:.2f}"])
    return out.getvalue()


def from_csv(text):
    inventory = Inventory()
    for row in csv.DictReader(io.StringIO(text)):
        inventory.add(row["name"], int(row["quantity"]), float(row["unit_price"]))
    return inventory
