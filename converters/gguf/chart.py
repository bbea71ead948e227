"""The trade-off `gguf:auto` measured, as a hand-written SVG chart (no plotting library).

Two panels share the x axis, the file's size (MiB): KL divergence from the float32 reference on a
log scale above, perplexity ratio (llama.cpp's over the reference's) below. Each candidate is one
`<g class="candidate" data-type=…>`: a labelled point in each panel when it was tried, a hollow point
on a strip between the panels (at its size) when the search skipped it. The budget is a dashed line
in the panel of its metric; the chosen type is ringed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from manifests import GGUFCandidate

WIDTH, HEIGHT = 760, 560
LEFT, RIGHT, TOP = 80, 30, 56
PANEL, GAP = 200, 60
MIB = float(1 << 20)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(step))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def render(candidates: Sequence[GGUFCandidate], budget: dict[str, float], chosen: str | None, title: str) -> str:
    """The SVG document (one string)."""
    sizes = [c.tensor_bytes / MIB for c in candidates] or [0.0, 1.0]
    x_lo, x_hi = min(sizes), max(sizes)
    pad = (x_hi - x_lo) * 0.06 or max(x_hi * 0.1, 1e-3)
    x_lo, x_hi = max(0.0, x_lo - pad), x_hi + pad
    inner = WIDTH - LEFT - RIGHT

    def x(mib: float) -> float:
        return LEFT + (mib - x_lo) / (x_hi - x_lo) * inner

    tried = [c for c in candidates if c.tried]
    kls = [c.metrics["kl_divergence"] for c in tried if c.metrics.get("kl_divergence", 0) > 0
           and math.isfinite(c.metrics["kl_divergence"])]
    if "kl_divergence" in budget and budget["kl_divergence"] > 0:
        kls.append(budget["kl_divergence"])
    k_lo = math.floor(math.log10(min(kls))) if kls else -4
    k_hi = math.ceil(math.log10(max(kls))) if kls else 0
    k_hi = max(k_hi, k_lo + 1)
    ppls = [c.metrics["perplexity_ratio"] for c in tried if math.isfinite(c.metrics.get("perplexity_ratio", math.nan))]
    ppls += [budget["perplexity_ratio"]] if "perplexity_ratio" in budget else []
    p_lo, p_hi = min([1.0, *ppls]), max([1.0, *ppls])
    p_hi = p_hi if p_hi > p_lo else p_lo + 0.01
    p_pad = (p_hi - p_lo) * 0.08
    p_lo, p_hi = p_lo - p_pad, p_hi + p_pad
    top_kl, top_ppl = TOP, TOP + PANEL + GAP

    def y_kl(v: float) -> float:
        v = min(max(v, 10.0 ** k_lo), 10.0 ** k_hi) if v > 0 else 10.0 ** k_lo
        return top_kl + PANEL - (math.log10(v) - k_lo) / (k_hi - k_lo) * PANEL

    def y_ppl(v: float) -> float:
        return top_ppl + PANEL - (v - p_lo) / (p_hi - p_lo) * PANEL

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>",
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="24" font-size="14" font-weight="bold">{escape(title)}</text>',
           f'<text x="{LEFT}" y="42" fill="#555">budget: '
           + escape(", ".join(f"{k} {'≥' if k == 'top1_agreement' else '≤'} {v:g}" for k, v in budget.items()))
           + (f"; chosen: {escape(chosen)}" if chosen else "; no candidate meets it") + "</text>"]
    for top, label in ((top_kl, "KL divergence (log)"), (top_ppl, "perplexity ratio")):
        out.append(f'<rect class="panel" x="{LEFT}" y="{top}" width="{inner}" height="{PANEL}" fill="none" '
                   'stroke="#333"/>')
        out.append(f'<text x="18" y="{top + PANEL / 2:.1f}" transform="rotate(-90 18 {top + PANEL / 2:.1f})" '
                   f'text-anchor="middle">{label}</text>')
    for e in range(k_lo, k_hi + 1):
        yy = y_kl(10.0**e)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + inner}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">1e{e}</text>')
    for v in _ticks(p_lo, p_hi, 4):
        yy = y_ppl(v)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + inner}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    base = top_ppl + PANEL
    for v in _ticks(x_lo, x_hi):
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{base}" y2="{base + 5}" stroke="#333"/>'
                   f'<text x="{x(v):.1f}" y="{base + 18}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{LEFT + inner / 2}" y="{base + 38}" text-anchor="middle">tensor data (MiB)</text>')
    for key, y, top in (("kl_divergence", y_kl, top_kl), ("perplexity_ratio", y_ppl, top_ppl)):
        if key in budget:
            yy = min(max(y(budget[key]), top), top + PANEL)
            out.append(f'<line class="budget" x1="{LEFT}" x2="{LEFT + inner}" y1="{yy:.1f}" y2="{yy:.1f}" '
                       f'stroke="#c00" stroke-dasharray="6 4"/><text x="{LEFT + inner - 4}" y="{yy - 4:.1f}" '
                       f'text-anchor="end" fill="#c00">budget {budget[key]:g}</text>')
    strip, untried = top_kl + PANEL + GAP / 2, 0
    if any(not c.tried for c in candidates):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + inner}" y1="{strip}" y2="{strip}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6}" y="{strip + 4}" text-anchor="end" fill="#999">not tried</text>')
    for c in candidates:
        cx = x(c.tensor_bytes / MIB)
        attrs = (f'class="candidate" data-type={quoteattr(c.type)} data-bytes="{c.tensor_bytes}" '
                 f'data-tried="{str(c.tried).lower()}"')
        parts = [f"<g {attrs}>", f"<title>{escape(_tooltip(c))}</title>"]
        if c.tried:
            colour = "#1a7f37" if c.meets else "#777"
            for key, y in (("kl_divergence", y_kl), ("perplexity_ratio", y_ppl)):
                value = c.metrics.get(key)
                if value is None or not math.isfinite(value):
                    continue
                cy = y(value)
                parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="{colour}"/>'
                             f'<text x="{cx + 7:.1f}" y="{cy - 6:.1f}">{escape(c.type)}</text>')
                if c.type == chosen:
                    parts.append(f'<circle class="chosen" cx="{cx:.1f}" cy="{cy:.1f}" r="9" fill="none" '
                                 'stroke="#1a7f37" stroke-width="2"/>')
        else:  # on the strip between the panels, labels alternating above and below: near sizes stay legible
            untried += 1
            label_y = strip - 7 if untried % 2 else strip + 14
            parts.append(f'<circle cx="{cx:.1f}" cy="{strip:.1f}" r="3.5" fill="white" stroke="#999"/>'
                         f'<text x="{cx:.1f}" y="{label_y:.1f}" text-anchor="middle" fill="#999">'
                         f"{escape(c.type)}</text>")
        parts.append("</g>")
        out.append("".join(parts))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _tooltip(c: GGUFCandidate) -> str:
    if not c.tried:
        return f"{c.type}: {c.tensor_bytes} bytes, not tried"
    figures = ", ".join(f"{k} {v:.4g}" for k, v in c.metrics.items())
    return f"{c.type}: {c.tensor_bytes} bytes, {'meets' if c.meets else 'misses'} the budget; {figures}"
