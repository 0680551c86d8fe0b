"""Experiments built on rlcycle's public API; not part of the package (nothing here ships in the wheel)."""
