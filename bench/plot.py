"""The comparison as a picture (PNG, matplotlib): per shape, each system's time and each peer's
time over ours, for the forward sweep and the decode steps."""

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

# Row keys of compare.py's tables -> legend names; "python" is ours through mha.MultiheadAttention.
FORWARD = {"halide": "ours (C++)", "python": "ours (Python)", "blas": "BLAS MHA",
           "nn.MultiheadAttention": "nn.MultiheadAttention", "F.linear+sdpa": "F.linear + SDPA",
           "ort": "ONNX Runtime"}
DECODE = {"ours": "ours (C++)", "python": "ours (Python)", "torch": "PyTorch",
          "ort": "ONNX Runtime"}
PEERS = ("blas", "nn.MultiheadAttention", "F.linear+sdpa", "ort", "torch")


def panels(axes, rows, names, labels, title):
    """Times (log scale) on the left, each peer's time over ours (C++ and Python) on the right."""
    x = range(len(rows))
    time_axis, ratio_axis = axes
    for key, name in names.items():
        times = [row.get(key) for row in rows]
        if any(t is not None for t in times):
            time_axis.plot(x, [t if t is not None else float("nan") for t in times], "o-",
                           label=name, markersize=4)
    ours_key = "halide" if "halide" in names else "ours"
    for key in PEERS:
        if key not in names:
            continue
        for ours, style in ((ours_key, "o-"), ("python", "s--")):
            ratios = [row[key] / row[ours] if row.get(key) and row.get(ours) else float("nan")
                      for row in rows]
            ratio_axis.plot(x, ratios, style, markersize=4,
                            label=f"{names[key]} / {names[ours]}")
    ratio_axis.axhline(1.0, color="black", linewidth=0.8)
    time_axis.set_yscale("log")
    time_axis.set_ylabel("ms (log)")
    ratio_axis.set_ylabel("peer time / ours (> 1: ours faster)")
    for axis in axes:
        axis.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6)
    time_axis.set_title(f"{title}: time")
    ratio_axis.set_title(f"{title}: peers over ours")


def comparison(rows, decode, subtitle, path):
    """rows: {((B, Sq, Sk, E, H), weights, threads): {system: ms}}; decode:
    {((B, N, E, H), threads): {system: ms}}."""
    sections = [(sorted(rows.items(), key=lambda kv: (kv[0][0][3], kv[0][0][1] * kv[0][0][2],
                                                      kv[0])), FORWARD,
                 lambda k: f"{','.join(map(str, k[0]))}{' w' if k[1] else ''} t{k[2]}",
                 "Forward (B,Sq,Sk,E,H; w: weights returned; t: threads)")]
    if decode:
        sections.append((sorted(decode.items()), DECODE,
                         lambda k: f"{','.join(map(str, k[0]))} t{k[1]}",
                         "Decode step (B,N cached,E,H; t: threads)"))
    figure, axes = plt.subplots(len(sections), 2, figsize=(16, 5.5 * len(sections)),
                                squeeze=False)
    for row_axes, (items, names, label, title) in zip(axes, sections):
        panels(row_axes, [value for _, value in items], names, [label(k) for k, _ in items],
               title)
    figure.suptitle(subtitle, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
