"""The loss curve as a self-contained SVG (no matplotlib needed): training
loss (moving average) and validation loss against tokens seen."""
import math


def _path(points, sx, sy):
    return " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(points))


def loss_svg(rows, title, width=720, height=420):
    train = [(r["tokens"], r["train_loss_ema"]) for r in rows if r.get("train_loss_ema") is not None]
    val = [(r["tokens"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    pts = train + val
    x_max = max(p[0] for p in pts) or 1
    y_lo = math.floor(min(p[1] for p in pts))
    y_hi = math.ceil(max(p[1] for p in pts))
    if y_hi == y_lo:
        y_hi = y_lo + 1
    left, right, top, bottom = 60, 20, 40, 50
    sx = lambda x: left + (width - left - right) * x / x_max  # noqa: E731
    sy = lambda y: top + (height - top - bottom) * (y_hi - y) / (y_hi - y_lo)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for k in range(5):   # gridlines and labels
        y = y_lo + (y_hi - y_lo) * k / 4
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        x = x_max * k / 4
        out.append(f'<text x="{sx(x):.1f}" y="{height - bottom + 18}" text-anchor="middle">{x / 1e6:.1f}M</text>')
    out.append(f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">tokens seen</text>')
    out.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">'
               f'cross-entropy (nats/token)</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
               f'fill="none" stroke="#444"/>')
    for pts_, color, label, dy in ((train, "#1f77b4", "train (moving average)", 0), (val, "#d62728", "validation", 16)):
        if pts_:
            out.append(f'<path d="{_path(pts_, sx, sy)}" fill="none" stroke="{color}" stroke-width="2"/>')
            out.append(f'<text x="{width - right - 10}" y="{top + 16 + dy}" text-anchor="end" fill="{color}">'
                       f'{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
