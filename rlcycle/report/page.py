"""HTML building blocks for the report: escaping, tables, sections, and the page around them.

Everything that comes from data goes through `esc` (html.escape, quotes included); markup we
build ourselves is wrapped in `Raw` so that it is not escaped twice. The page is one file: CSS
inline, charts inline SVG, no script and nothing fetched from the network.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from rlcycle import console
from rlcycle.errors import RlcycleError
from rlcycle.report.load import Unavailable


class Raw(str):
    """Markup built here: inserted as is."""


def esc(x: Any) -> Raw:
    return x if isinstance(x, Raw) else Raw(escape("" if x is None else str(x), quote=True))


def tag(name: str, body: Any, cls: str | None = None) -> Raw:
    attr = f' class="{esc(cls)}"' if cls else ""
    return Raw(f"<{name}{attr}>{esc(body)}</{name}>")


def join(parts: Sequence[Any]) -> Raw:
    return Raw("".join(esc(p) for p in parts))


def table(headers: Sequence[Any], rows: Sequence[Sequence[Any]], cls: str = "data") -> Raw:
    """A table; cells are text (escaped) or Raw. Numeric-looking cells align right (CSS)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return Raw(f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def dl(items: Sequence[tuple[Any, Any]]) -> Raw:
    return Raw('<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items) + "</dl>")


def badge(text: str, kind: str) -> Raw:
    return Raw(f'<span class="badge {esc(kind)}">{esc(text)}</span>')


def not_available(why: str) -> Raw:
    return Raw(f'<p class="na">not available: {esc(why)}</p>')


def charts(*svgs: str) -> Raw:
    return Raw('<div class="charts">' + "".join(f"<figure>{s}</figure>" for s in svgs) + "</div>")


def compact(value: Any, limit: int = 90) -> str:
    """A short text form of a JSON value for a table cell."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Section:
    id: str
    title: str
    body: Raw
    available: bool
    why: str = ""

    def html(self) -> str:
        cls = "" if self.available else ' class="unavailable"'
        return f'<section id="{esc(self.id)}"{cls}><h2>{esc(self.title)}</h2>{self.body}</section>'

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "available": self.available,
            **({"why": self.why} if self.why else {}),
        }


def block(fn: Callable[..., Raw], *args: Any) -> tuple[Raw, str | None]:
    """Run one piece of a section: (its html, None), or (a 'not available' note, why).

    A missing or unreadable input is `Unavailable`. Any other error is a bug in the report or
    a file we do not understand: it becomes a note as well (a partial report is worth more
    than none), is printed on stderr, and is raised with RLCYCLE_DEBUG=1.
    """
    try:
        return fn(*args), None
    except Unavailable as e:
        return not_available(str(e)), str(e)
    except (RlcycleError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
        if os.environ.get("RLCYCLE_DEBUG") == "1":
            raise
        why = f"could not draw this part ({type(e).__name__}: {e})"
        console.warn(f"report: {why}")
        return not_available(why), why


def section(id: str, title: str, *pieces: tuple[Callable[..., Raw], tuple]) -> Section:
    """A section from pieces; it is unavailable when every piece is."""
    bodies, whys = [], []
    for fn, args in pieces:
        body, why = block(fn, *args)
        bodies.append(body)
        whys.append(why)
    if all(whys):
        reasons = list(dict.fromkeys(whys))  # the same reason once
        return Section(id, title, join([not_available(w) for w in reasons]), False, "; ".join(reasons))
    return Section(id, title, join(bodies), True)


CSS = """
:root { --fg:#1d1d1f; --muted:#666; --line:#e1e1e6; --bg:#fafafa; --ok:#0a7d3b; --bad:#b3261e; --warn:#8a5a00; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0;
       background: var(--bg); }
main { max-width: 1380px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 0 0 12px; }
h3 { font-size: 15px; margin: 18px 0 8px; }
nav { margin: 8px 0 20px; display: flex; flex-wrap: wrap; gap: 6px 14px; }
nav a { color: #0058a3; text-decoration: none; } nav a.na { color: var(--muted); text-decoration: line-through; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 18px 22px; margin: 0 0 18px; }
section.unavailable { background: #f4f4f6; }
p.na { color: var(--muted); font-style: italic; margin: 6px 0; }
p.note, .muted { color: var(--muted); font-size: 12.5px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0 0 12px; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; font-family: ui-monospace, Menlo, monospace;
       font-size: 12.5px; overflow-wrap: anywhere; }
table.data { border-collapse: collapse; margin: 6px 0 14px; font-size: 13px; }
table.data th, table.data td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: left;
       vertical-align: top; }
table.data th { background: #f3f3f6; font-weight: 600; }
table.data td { font-variant-numeric: tabular-nums; }
table.data.nowrap td { white-space: nowrap; }
.scroll { overflow-x: auto; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; font-weight: 600; font-size: 12.5px; }
.badge.ok { background: #ddf3e4; color: var(--ok); } .badge.bad { background: #fbe1df; color: var(--bad); }
.badge.neutral { background: #ececf0; color: #444; } .badge.warn { background: #fdf0d5; color: var(--warn); }
.callout { border-left: 4px solid; padding: 6px 12px; margin: 6px 0; border-radius: 3px; }
.callout.bad { border-color: var(--bad); background: #fdf1f0; } .callout.warn { border-color: #e0a400; background: #fffaf0; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 12px 18px; margin: 8px 0 14px; }
.charts figure { margin: 0; } svg.chart { width: 100%; height: auto; display: block; }
footer { color: var(--muted); font-size: 12px; text-align: center; }
"""


def page(title: str, heading: str, sections: Sequence[Section], footer: str) -> str:
    """The whole document: heading, a table of contents, the sections, a footer."""
    na = ' class="na"'
    nav = "".join(f'<a href="#{esc(s.id)}"{"" if s.available else na}>{esc(s.title)}</a>' for s in sections)
    body = "".join(s.html() for s in sections)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{esc(heading)}</h1><nav>{nav}</nav>{body}<footer>{esc(footer)}</footer></main></body></html>\n"
    )
