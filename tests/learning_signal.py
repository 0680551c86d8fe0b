"""The reward of the learning regression test (tests/test_learning.py), loaded by dotted path
(`fn = "learning_signal:first_token_in_set"`) by distill in the cycles the test runs.

A sample earns 1 when the first token it generated is in a fixed set (ids divisible by
`modulus`: 1/8 of the vocabulary), else 0. The tiny random model starts near 1/8, and only a
correct distill -> train can raise it: the reward depends on the token at one position, so a
flipped reward, advantage or loss sign pushes it down, and logprobs shifted by one token train
the logits of a position on the next position's token, which the reward does not depend on.
"""

from __future__ import annotations

import polars as pl


def first_token_in_set(frame: pl.DataFrame, modulus: int = 4, residue: int = 0) -> pl.Series:
    """1.0 when completion_ids[0] % modulus == residue, 0.0 otherwise (null: no completion)."""
    first = frame.get_column("completion_ids").list.first()
    return ((first % modulus) == residue).cast(pl.Float64)


def rate(frame: pl.DataFrame, modulus: int = 4, residue: int = 0) -> float:
    """The share of samples whose first token is in the set: the policy's mean reward."""
    return float(first_token_in_set(frame, modulus, residue).drop_nulls().mean())
