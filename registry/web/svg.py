"""Pictures drawn on the server as inline SVG: the alias history as a timeline, a rollout's progress, a gguf:auto
run's trade-off.

Every string from the store goes through `escape`; only presentation attributes are used (no `style=`),
which the pages' Content-Security-Policy allows, and no script.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

from markupsafe import Markup, escape

#: Colour of each history action.
ACTION_COLOURS = {"promote": "#2b6cb0", "rollback": "#c05621", "repair": "#718096", "sync": "#2f855a"}
WIDTH, LANE, LEFT, RIGHT, TOP = 760, 34, 120, 30, 24


def _x(at: float, first: float, last: float) -> float:
    span = last - first
    return LEFT + (WIDTH - LEFT - RIGHT) * ((at - first) / span if span > 0 else 0.5)


def timeline(entries: list[dict[str, Any]]) -> Markup:
    """The history (entries as `mreg history --json` writes them): one lane per alias, a dot per change labelled
    with the version it points to, the line between dots the time the alias stayed there; hover for who and why."""
    if not entries:
        return Markup("")
    times = [dt.datetime.fromisoformat(e["by"]["at"]).timestamp() for e in entries]
    first, last = min(times), max(times)
    lanes = sorted({e["alias"] for e in entries})
    height = TOP + LANE * len(lanes) + 26
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="alias history timeline">']
    for i, alias in enumerate(lanes):
        y = TOP + LANE * i + LANE / 2
        parts.append(f'<text x="8" y="{y + 4:.1f}" font-size="13" fill="#1a202c">{escape(alias)}</text>')
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e2e8f0"/>')
        mine = sorted(((t, e) for t, e in zip(times, entries, strict=True) if e["alias"] == alias),
                      key=lambda te: te[0])
        for (t, _), (t2, _) in itertools.pairwise(mine):
            parts.append(f'<line x1="{_x(t, first, last):.1f}" y1="{y:.1f}" x2="{_x(t2, first, last):.1f}" '
                         f'y2="{y:.1f}" stroke="#4a5568" stroke-width="3"/>')
        for t, e in mine:
            x = _x(t, first, last)
            colour = ACTION_COLOURS.get(e["action"], "#1a202c")
            tip = (f'{e["by"]["at"][:19]} {e["action"]} {alias}: {e.get("from") or "-"} → {e["to"]} by '
                   f'{e["by"]["user"]}@{e["by"]["host"]}' + (f' ({e["reason"]})' if e.get("reason") else ""))
            parts.append(f'<g><title>{escape(tip)}</title><circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour}"/>'
                         f'<text x="{x:.1f}" y="{y - 10:.1f}" font-size="11" text-anchor="middle" '
                         f'fill="#1a202c">{escape(str(e["to"]))}</text></g>')
    axis = TOP + LANE * len(lanes) + 16
    for t, anchor in ((first, "start"), (last, "end")):
        label = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        x = LEFT if anchor == "start" else WIDTH - RIGHT
        parts.append(f'<text x="{x}" y="{axis}" font-size="11" text-anchor="{anchor}" fill="#4a5568">{label}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def rollout(doc: dict[str, Any]) -> Markup:
    """A rollout's progress (as `rollouts_doc` gives it): one bar per step, those taken filled, the weight in force
    marked; the stable version's share is what the canary's leaves."""
    steps: list[int] = doc["steps"]
    width, bar, gap, top = 560, 28, 10, 22
    cell = (width - 20 - gap * (len(steps) - 1)) / max(len(steps), 1)
    height = top + bar + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="rollout" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="rollout progress">',
             f'<text x="10" y="14" font-size="12" fill="#1a202c">{escape(doc["alias"])}: '
             f'{escape(str(doc["stable"]))} → {escape(str(doc["canary"]))}, canary at {int(doc["weight"])}% '
             f'({escape(doc["state"])})</text>']
    for i, weight in enumerate(steps):
        x = 10 + i * (cell + gap)
        taken = i <= int(doc["step"])
        fill = "#2b6cb0" if taken else "#e2e8f0"
        parts.append(f'<g><title>step {i + 1}: {int(weight)}%</title><rect x="{x:.1f}" y="{top}" width="{cell:.1f}" '
                     f'height="{bar}" fill="{fill}" stroke="#4a5568"/>'
                     f'<text x="{x + cell / 2:.1f}" y="{top + bar + 16}" font-size="11" text-anchor="middle" '
                     f'fill="#1a202c">{int(weight)}%</text></g>')
    parts.append("</svg>")
    return Markup("".join(parts))


def tradeoff(selection: dict[str, Any]) -> Markup:
    """A gguf:auto selection (the manifest's `requirements.selection`): each candidate's size against its KL
    divergence, the budget as a line, the chosen type ringed."""
    points = [(c.get("file_bytes") or c["tensor_bytes"], c["metrics"]["kl_divergence"], c)
              for c in selection.get("candidates", []) if "kl_divergence" in c.get("metrics", {})]
    if not points:
        return Markup("")
    w, h, pad = 520, 260, 48
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    budget = selection.get("budget", {}).get("kl_divergence")
    top = max([*ys, budget or 0.0]) or 1.0
    lo, hi = min(xs), max(xs)

    def px(v: float) -> float:
        return pad + (w - 2 * pad) * ((v - lo) / (hi - lo) if hi > lo else 0.5)

    def py(v: float) -> float:
        return h - pad - (h - 2 * pad) * (v / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tradeoff" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="size against KL divergence">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#4a5568"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#4a5568"/>',
             f'<text x="{w / 2}" y="{h - 12}" font-size="11" text-anchor="middle" fill="#4a5568">file size</text>',
             f'<text x="12" y="{pad - 12}" font-size="11" fill="#4a5568">KL divergence</text>']
    if budget is not None:
        parts.append(f'<line x1="{pad}" y1="{py(budget):.1f}" x2="{w - pad}" y2="{py(budget):.1f}" '
                     f'stroke="#c53030" stroke-dasharray="4 3"/>')
    for x, y, c in points:
        chosen = c["type"] == selection.get("chosen")
        parts.append(f'<g><title>{escape(c["type"])}: {x} bytes, KL {y:.4g}</title>'
                     f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{7 if chosen else 5}" '
                     f'fill="{"#2b6cb0" if c.get("meets") else "#a0aec0"}"'
                     + (' stroke="#1a202c" stroke-width="2"' if chosen else "") + "/>"
                     f'<text x="{px(x):.1f}" y="{py(y) - 9:.1f}" font-size="10" text-anchor="middle" '
                     f'fill="#1a202c">{escape(c["type"])}</text></g>')
    parts.append("</svg>")
    return Markup("".join(parts))
