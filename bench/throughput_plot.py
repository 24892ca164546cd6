"""The plot of bench/throughput_bench.py's scaling runs: throughput against the number of GPUs,
one line per pipeline and per-replica concurrency, beside linear scaling."""
import html


def scaling_svg(runs, title):
    """An SVG plot of throughput against replicas: one solid line per (pipeline, per-replica
    concurrency) over its runs, and a dashed one for linear scaling from its one-replica run.
    None when no series has runs of more than one pool size."""
    series = {}
    for s in runs.values():
        series.setdefault((s["pipeline"], s["per_replica"]), []).append(
            (len(s["replicas"]), s["throughput_rps"]))
    series = {k: sorted(v) for k, v in series.items() if len({n for n, _ in v}) > 1}
    if not series:
        return None
    width, height, left, right, top, bottom = 640, 400, 60, 190, 40, 50
    max_n = max(n for points in series.values() for n, _ in points)
    max_y = 1.1 * max(max(r for _, r in points) for points in series.values())
    for points in series.values():
        if points[0][0] == 1:
            max_y = max(max_y, 1.05 * max_n * points[0][1])

    def x(n):
        return left + (width - left - right) * (n - 1) / max(max_n - 1, 1)

    def y(v):
        return height - bottom - (height - top - bottom) * v / max_y

    colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{html.escape(title)}</text>',
           f'<line x1="{left}" y1="{y(0):.1f}" x2="{width - right}" y2="{y(0):.1f}" '
           'stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0):.1f}" stroke="black"/>',
           f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">'
           'GPUs (replicas)</text>',
           f'<text x="16" y="{(top + height - bottom) / 2}" text-anchor="middle" '
           f'transform="rotate(-90 16 {(top + height - bottom) / 2})">requests / s</text>']
    for n in range(1, max_n + 1):
        out.append(f'<text x="{x(n):.1f}" y="{y(0) + 16:.1f}" text-anchor="middle">{n}</text>')
    for i in range(5):
        v = max_y * i / 4
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for i, ((pipeline, per_replica), points) in enumerate(sorted(series.items(), key=str)):
        color = colors[i % len(colors)]
        label = f"{pipeline}, {per_replica} in flight" + (" per GPU" if isinstance(
            per_replica, int) else "")
        coords = " ".join(f"{x(n):.1f},{y(r):.1f}" for n, r in points)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        out += [f'<circle cx="{x(n):.1f}" cy="{y(r):.1f}" r="3.5" fill="{color}"/>'
                for n, r in points]
        if points[0][0] == 1:
            linear = f"{x(1):.1f},{y(points[0][1]):.1f} {x(max_n):.1f}," \
                     f"{y(max_n * points[0][1]):.1f}"
            out.append(f'<polyline fill="none" stroke="{color}" stroke-dasharray="5,4" '
                       f'points="{linear}"/>')
        ly = top + 18 * i
        out.append(f'<line x1="{width - right + 12}" y1="{ly}" x2="{width - right + 32}" '
                   f'y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{width - right + 38}" y="{ly + 4}">{html.escape(label)}</text>')
    ly = top + 18 * len(series)
    out.append(f'<line x1="{width - right + 12}" y1="{ly}" x2="{width - right + 32}" y2="{ly}" '
               'stroke="gray" stroke-dasharray="5,4"/>')
    out.append(f'<text x="{width - right + 38}" y="{ly + 4}">linear</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
