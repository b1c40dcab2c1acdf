"""Server-side SVG charts: stacked bars and lines over time buckets, no JavaScript.

Each chart is a self-contained ``<svg>`` with a ``<title>`` per mark, so hovering a bar
shows its value in any browser, and a legend. Labels are escaped here; numbers are
formatted here; nothing from a request reaches the markup unescaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 32, 40
COLORS = {"full": "#3b5bdb", "fast": "#f08c00", "none": "#868e96",
          "escalated": "#c2255c", "fallbacks": "#5c940d", "errors": "#e03131"}  # fmt: skip
FALLBACK_COLORS = ("#1098ad", "#7048e8", "#d6336c", "#37b24d")


def _color(name: str, i: int) -> str:
    return COLORS.get(name, FALLBACK_COLORS[i % len(FALLBACK_COLORS)])


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10.0 ** len(str(int(value))) / 10
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= value:
            return m * step
    return value


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:,.2f}"


def _frame(title: str, y_max: float, unit: str, times: Sequence[datetime]) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="18" font-size="13" font-weight="600">{escape(title)}</text>',
    ]
    for i in range(5):
        v = y_max * i / 4
        y = TOP + plot_h - plot_h * i / 4
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#dee2e6"/>')  # fmt: skip
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    out.append(
        f'<text x="12" y="{TOP + plot_h / 2:.0f}" transform="rotate(-90 12 {TOP + plot_h / 2:.0f})" '
        f'text-anchor="middle">{escape(unit)}</text>'
    )
    if times:
        n = len(times)
        for i in sorted({0, n // 2, n - 1}):
            x = LEFT + plot_w * (i + 0.5) / n
            out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                       f'{times[i]:%m-%d %H:%M}</text>')  # fmt: skip
    return out


def _legend(names: Sequence[str]) -> str:
    parts = []
    x = LEFT
    for i, name in enumerate(names):
        parts.append(f'<rect x="{x}" y="{HEIGHT - 14}" width="10" height="10" '
                     f'fill="{_color(name, i)}"/>'
                     f'<text x="{x + 14}" y="{HEIGHT - 5}">{escape(name)}</text>')  # fmt: skip
        x += 24 + 7 * len(name)
    return "".join(parts)


def stacked_bars(
    title: str, times: Sequence[datetime], series: dict[str, Sequence[float]], unit: str
) -> Markup:
    """One bar per bucket, the series stacked in the order given."""
    names = list(series)
    totals = [sum(series[s][i] for s in names) for i in range(len(times))]
    y_max = _nice_max(max(totals, default=0))
    out = _frame(title, y_max, unit, times)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = max(len(times), 1)
    bar_w = max(plot_w / n * 0.8, 1)
    for i, t in enumerate(times):
        x = LEFT + plot_w * i / n + (plot_w / n - bar_w) / 2
        base = float(TOP + plot_h)
        for j, name in enumerate(names):
            v = series[name][i]
            if v <= 0:
                continue
            h = plot_h * v / y_max
            base -= h
            out.append(
                f'<rect class="bar" data-series="{escape(name)}" x="{x:.1f}" y="{base:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}" fill="{_color(name, j)}">'
                f"<title>{t:%Y-%m-%d %H:%M} {escape(name)}: {_fmt(v)}</title></rect>"
            )
    out.append(_legend(names))
    out.append("</svg>")
    return Markup("".join(out))


def lines(
    title: str, times: Sequence[datetime], series: dict[str, Sequence[float | None]], unit: str
) -> Markup:
    """One polyline per series; a bucket with no value breaks the line."""
    names = list(series)
    values = [v for s in names for v in series[s] if v is not None]
    y_max = _nice_max(max(values, default=0))
    out = _frame(title, y_max, unit, times)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = max(len(times), 1)
    for j, name in enumerate(names):
        run: list[str] = []
        runs = [run]
        for i, v in enumerate(series[name]):
            if v is None:
                run = []
                runs.append(run)
                continue
            x = LEFT + plot_w * (i + 0.5) / n
            y = TOP + plot_h - plot_h * v / y_max
            run.append(f"{x:.1f},{y:.1f}")
            out.append(
                f'<circle class="point" data-series="{escape(name)}" cx="{x:.1f}" cy="{y:.1f}" '
                f'r="2.5" fill="{_color(name, j)}"><title>{times[i]:%Y-%m-%d %H:%M} '
                f"{escape(name)}: {_fmt(v)} {escape(unit)}</title></circle>"
            )
        for r in runs:
            if len(r) > 1:
                out.append(f'<polyline fill="none" stroke="{_color(name, j)}" stroke-width="2" '
                           f'points="{" ".join(r)}"/>')  # fmt: skip
    out.append(_legend(names))
    out.append("</svg>")
    return Markup("".join(out))
