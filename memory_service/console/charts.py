"""The console's pictures as inline SVG, drawn on the server: a bar (a limit's use, a score, an extraction's
progress) and a row of columns (a week of a limit's use, an hour of jobs).

Text, not a chart library: the pages load no script and nothing from a CDN (the CSP allows neither), and
each picture says its numbers in `aria-label` and in `<title>`s, so a screen reader (and a test) reads
what a sighted operator sees. Every name and number goes through `Markup.format`, which escapes it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from markupsafe import Markup

BAR_W, BAR_H = 120, 10
# control characters and bidi overrides in a name would garble or reorder the words read out around it
HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
COLUMNS_W, COLUMNS_H = 168, 28


def shown(text: str) -> str:
    """A name as the picture says it: what is invisible or reorders text becomes a visible U+FFFD."""
    return HIDDEN.sub("\ufffd", text)


def number(value: float) -> str:
    """A count with thousands separators; a fraction to 4 decimals (a score)."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.4f}"


def fraction(value: float, whole: float) -> float:
    """How much of the bar `value` fills: 0 to 1, full past `whole`, empty for nothing or less."""
    if value <= 0:
        return 0.0
    if whole <= 0:
        return 1.0  # anything of a zero allowance is over it
    return min(1.0, value / whole)


def percent(value: float, whole: float) -> str:
    return f"{100 * max(0.0, value) / whole:,.0f}%" if whole > 0 else "no allowance"


def bar(value: float, whole: float, label: str, *, says: str | None = None, width: int = BAR_W) -> Markup:
    """`value` of `whole` as a filled bar; past `whole` it is full and its class says `over`.

    `says` replaces the default words ("emails: 3 of 5 (60%)") of the label and the tooltip."""
    words = shown(
        says if says is not None else f"{label}: {number(value)} of {number(whole)} ({percent(value, whole)})"
    )
    over = value > whole
    return Markup(
        '<svg class="chart bar{over}" role="img" aria-label="{words}" width="{w}" height="{h}" '
        'viewBox="0 0 {w} {h}" data-value="{value}" data-whole="{whole}"><title>{words}</title>'
        '<rect class="track" width="{w}" height="{h}" rx="2"/>'
        '<rect class="fill" width="{fill}" height="{h}" rx="2"/></svg>'
    ).format(
        over=" over" if over else "",
        words=words,
        w=width,
        h=BAR_H,
        value=value,
        whole=whole,
        fill=round(fraction(value, whole) * width, 1),
    )


def columns(
    points: Sequence[tuple[str, float | None]],
    label: str,
    *,
    ceiling: float | None = None,
    unit: str = "",
    width: int = COLUMNS_W,
    height: int = COLUMNS_H,
) -> Markup:
    """One column per (name, value), scaled to the largest value or to `ceiling` (a limit, drawn as a line);
    a value of None is a gap (nothing was measured then), a zero a hairline on the baseline."""
    label = shown(label)
    if not points:
        return Markup(
            '<svg class="chart columns" role="img" aria-label="{0}: no data" width="{1}" height="{2}">'
            "<title>{0}: no data</title></svg>"
        ).format(label, width, height)
    top = max([ceiling or 0.0, 1.0, *(v for _, v in points if v is not None)])
    step = width / len(points)
    parts, said = [], []
    for i, (name, value) in enumerate(points):
        words = shown(f"{name}: not measured" if value is None else f"{name}: {number(value)}{unit}")
        said.append(words)
        if value is None:
            parts.append(Markup('<g class="gap"><title>{0}</title></g>').format(words))
            continue
        tall = max(1.0, round(fraction(value, top) * (height - 2), 1))
        over = " over" if ceiling is not None and value > ceiling else ""
        parts.append(
            Markup('<rect class="col{0}" x="{1}" y="{2}" width="{3}" height="{4}"><title>{5}</title></rect>').format(
                over, round(i * step + 1, 1), round(height - tall, 1), round(max(1.0, step - 2), 1), tall, words
            )
        )
    parts.append(Markup('<line class="axis" x1="0" x2="{0}" y1="{1}" y2="{1}"/>').format(width, height))
    if ceiling is not None and ceiling > 0:
        y = round(height - fraction(ceiling, top) * (height - 2), 1)
        parts.append(
            Markup('<line class="limit" x1="0" x2="{0}" y1="{1}" y2="{1}"><title>limit {2}</title></line>').format(
                width, y, number(ceiling)
            )
        )
    summary = f"{label}: " + "; ".join(said)
    return Markup(
        '<svg class="chart columns" role="img" aria-label="{0}" width="{1}" height="{2}" viewBox="0 0 {1} {2}">'
        "<title>{0}</title>{3}</svg>"
    ).format(summary, width, height, Markup("").join(parts))
