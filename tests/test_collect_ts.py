"""collect's timestamps: the numpy parse of the writer's form gives what polars' parser gives.

`events._writer_form_ms` reads `YYYY-MM-DDTHH:MM:SS.mmmZ` from its digits; every other ts (and
any impossible date or time in that form) is left to polars. The oracle here is the parse
collect used before (polars `to_datetime`, then epoch-ms digits, then the general path), run
on the same strings.
"""

from __future__ import annotations

import random

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcycle.collect.events import _writer_form_ms, normalise

FORM = "%Y-%m-%dT%H:%M:%S%.fZ"


def polars_ms(text: pl.Series) -> pl.Series:
    """The previous first step: polars' parse of the form, then epoch-ms digits."""
    ms = text.str.to_datetime(FORM, strict=False, time_zone="UTC").dt.epoch("ms")
    return ms.fill_null(text.str.to_integer(strict=False))


def writer_form(rng: random.Random) -> str:
    """A ts in the writer's form, sometimes with an impossible field."""
    fields = [
        rng.choice([1899, 1900, 1969, 1970, 1999, 2000, 2024, 2026, 2100, 2400, 9999, rng.randint(1900, 2200)]),
        rng.choice([0, 1, 2, 2, 12, 13, rng.randint(1, 12)]),
        rng.choice([0, 1, 28, 29, 29, 30, 31, 32, rng.randint(1, 28)]),
        rng.choice([0, 23, 24, rng.randint(0, 23)]),
        rng.choice([0, 59, 60, rng.randint(0, 59)]),
        rng.choice([0, 59, 60, rng.randint(0, 59)]),
        rng.randint(0, 999),
    ]
    return "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z".format(*fields)


def other(rng: random.Random) -> str | None:
    """Anything else a log may hold in ts."""
    return rng.choice(
        [
            None,
            str(rng.randint(946_684_800_000, 4_102_444_800_000)),  # epoch ms as digits
            "2026-11-30T07:59:56.92Z",  # two digits of fraction
            "2026-11-30T07:59:56.927123Z",  # microseconds
            "2026-11-30T07:59:56Z",
            "2026-11-30T07:59:56.927+00:00",
            "2026-11-30 07:59:56.927Z",
            "2026-11-30T07:59:56,927Z",  # 24 characters, a comma
            "2026-1I-30T07:59:56.927Z",  # 24 characters, a letter
            "2026-11-30T07:59:56.927z",
            "x" * 24,
            "",
        ]
    )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 200), share=st.floats(0, 1))
def test_writer_form_matches_polars(seed, n, share):
    rng = random.Random(seed)
    values = [writer_form(rng) if rng.random() < share else other(rng) for _ in range(n)]
    text = pl.Series("ts", values, pl.String)
    want = polars_ms(text)
    fast = _writer_form_ms(text)
    if fast is None:  # no ts has the form's length
        assert all(v is None or len(v) != 24 for v in values)
        return
    # Where the fast parse gives a value, polars gives the same; where it gives none, the value
    # comes from the steps after it, as before.
    both = fast.is_not_null()
    assert fast.filter(both).to_list() == want.filter(both).to_list()
    frame = pl.DataFrame({"ts": text})
    assert normalise(frame, "f").get_column("ts_ms").to_list() == polars_ms_general(frame)


def polars_ms_general(frame: pl.DataFrame) -> list:
    """What normalise gave before the fast parse: polars' steps only."""
    text = frame.get_column("ts")
    ms = polars_ms(text)
    if not (ms.is_null() & text.is_not_null()).any():
        return ms.to_list()
    return normalise_without_fast(frame)


def normalise_without_fast(frame: pl.DataFrame) -> list:
    import rlcycle.collect.events as events

    saved = events._writer_form_ms
    events._writer_form_ms = lambda text: None
    try:
        return events.normalise(frame, "f").get_column("ts_ms").to_list()
    finally:
        events._writer_form_ms = saved


def test_writer_form_on_a_sliced_multi_chunk_series():
    """The arrow behind a polars Series may be a slice of several chunks: offsets are read
    from where the slice starts."""
    a = pl.Series("ts", ["2026-11-30T07:59:56.927Z", "1764489596927", None], pl.String)
    b = pl.Series("ts", ["2024-02-29T23:59:59.999Z", "2026-11-30T07:59:56.927Z"], pl.String)
    text = a.append(b).slice(1, 4)
    assert _writer_form_ms(text).to_list() == [None, None, 1709251199999, 1796025596927]
    assert polars_ms(text).to_list() == [1764489596927, None, 1709251199999, 1796025596927]
