"""The comparison as a picture (PNG, matplotlib): per shape, each system's time and each peer's
time over ours, for the forward sweep and the decode steps."""

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

# Row keys of compare.py's tables -> legend names, ours (C++) first; "python" is ours through
# mha.MultiheadAttention.
FORWARD = {"halide": "ours (C++)", "python": "ours (Python)", "blas": "BLAS MHA",
           "nn.MultiheadAttention": "nn.MultiheadAttention", "F.linear+sdpa": "F.linear + SDPA",
           "ort": "ONNX Runtime"}
DECODE = {"ours": "ours (C++)", "python": "ours (Python)", "torch": "PyTorch",
          "ort": "ONNX Runtime"}
PEERS = ("blas", "nn.MultiheadAttention", "F.linear+sdpa", "ort", "torch")


def series(axis, values, style, label):
    """One line through the shapes that have a value (a peer may lack some, e.g. ONNX Runtime
    where the weights are returned)."""
    points = [(x, v) for x, v in enumerate(values) if v is not None]
    if points:
        axis.plot(*zip(*points), style, label=label, markersize=4)


def panels(axes, rows, names, labels, title):
    """Times (log scale) on the left; on the right each peer's time over ours (C++), and the
    faster peer's over ours through Python."""
    time_axis, ratio_axis = axes
    for key, name in names.items():
        series(time_axis, [row.get(key) for row in rows], "o-", name)
    ours_key = next(iter(names))
    peers = [key for key in PEERS if key in names]
    for key in peers:
        series(ratio_axis, [row[key] / row[ours_key] if row.get(key) else None for row in rows],
               "o-", f"{names[key]} / ours (C++)")
    fastest = [min(row[key] for key in peers if row.get(key) and key != "blas") for row in rows]
    series(ratio_axis, [f / row["python"] if row.get("python") else None
                        for f, row in zip(fastest, rows)], "s--k",
           "fastest Python peer / ours (Python)")
    ratio_axis.axhline(1.0, color="gray", linewidth=0.8)
    time_axis.set_yscale("log")
    time_axis.set_ylabel("ms (log)")
    ratio_axis.set_ylabel("peer time / ours (> 1: ours faster)")
    for axis in axes:
        axis.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    time_axis.set_title(f"{title}: time")
    ratio_axis.set_title(f"{title}: peers over ours")


def comparison(rows, decode, subtitle, path):
    """rows: {((B, Sq, Sk, E, H), weights, threads): {system: ms}}; decode:
    {((B, N, E, H, KV heads), threads): {system: ms}}."""
    sections = [(sorted(rows.items(), key=lambda kv: (kv[0][0][3], kv[0][0][1] * kv[0][0][2],
                                                      kv[0])), FORWARD,
                 lambda k: f"{','.join(map(str, k[0]))}{' w' if k[1] else ''} t{k[2]}",
                 "Forward (B,Sq,Sk,E,H; w: weights returned; t: threads)")]
    if decode:
        sections.append((sorted(decode.items()), DECODE,
                         lambda k: f"{','.join(map(str, k[0]))} t{k[1]}",
                         "Decode step (B,N cached,E,H,KV heads; t: threads)"))
    figure, axes = plt.subplots(len(sections), 2, figsize=(16, 5.5 * len(sections)),
                                squeeze=False)
    for row_axes, (items, names, label, title) in zip(axes, sections):
        panels(row_axes, [value for _, value in items], names, [label(k) for k, _ in items],
               title)
    figure.suptitle(subtitle, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
