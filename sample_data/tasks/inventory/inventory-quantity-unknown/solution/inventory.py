"""A tiny stock keeper: items with a quantity and a unit price."""


class Inventory:
    def __init__(self):
        self.items = {}  # name -> (quantity, unit_price)

    def add(self, name, quantity, unit_price):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        old_quantity, _ = self.items.get(name, (0, unit_price))
        self.items[name] = (old_quantity + quantity, unit_price)

    def remove(self, name, quantity):
        if name not in self.items:
            raise KeyError(name)
        have, price = self.items[name]
        if quantity > have:
            raise ValueError(f"only {have} {name} in stock")
        if quantity == have:
            del self.items[name]
        else:
            self.items[name] = (have - quantity, price)

    def quantity(self, name):
        return self.items.get(name, (0, 0))[0]

    def total_value(self):
        return sum(q * p for q, p in self.items.values())

    def low_stock(self, threshold=5):
        """Names with fewer than `threshold` units, sorted."""
        return sorted(n for n, (q, _) in self.items.items() if q < threshold)
