"""Parse and format dates."""
from datetime import date


def parse_date(text):
    """'2024-03-31' (ISO) or '03/31/2024' (US: month/day/year) -> date."""
    text = text.strip()
    if "-" in text:
        year, month, day = text.split("-")
    elif "/" in text:
        month, day, year = text.split("/")
    else:
        raise ValueError(f"unknown date format: {text!r}")
    return date(int(year), int(month), int(day))


def format_date(d, style="iso"):
    """date -> '2024-03-31' (iso) or '03/31/2024' (us)."""
    if style == "iso":
        return d.isoformat()
    if style == "us":
        return f"{d.month:02d}/{d.day:02d}/{d.year}"
    raise ValueError(f"unknown style: {style!r}")


def days_between(a, b):
    """Whole days from date text a to date text b (negative when b is earlier)."""
    return (parse_date(b) - parse_date(a)).days
