"""The attention core against torch's F.scaled_dot_product_attention, from Python, in one run:
interleaved rounds, medians, both on the same threads.

    .venv-torch/bin/python bench/sdpa_compare.py --out build/bench/sdpa.md --plot build/bench/sdpa.png

Tables: the ceilings (GEMM, streaming read) measured in the same run; prefill (S 512-4096, d 64
and 128, causal or not, grouped-query heads, f32 and bf16); a sliding window of 512 at S = 4096
against our own full causal; one query against caches of 512-8192 keys; generate() tokens/s of
a small random Llama with attn_implementation "mha" against "sdpa". FLOPs count 4·Sq·Sk·d per head (Q·Kᵀ and weights·V), halved when causal.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import mha


def timed(call, min_time):
    """Median seconds of `call` over at least 3 calls and `min_time` seconds, after a warm-up."""
    call()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(calls, rounds, min_time):
    """Median over `rounds` rounds, each timing every call once in turn: {name: seconds}."""
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(timed(call, min_time))
    return {name: statistics.median(s) for name, s in samples.items()}


def prefill_rows(args):
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for d in (64, 128):
            for S in args.lengths:
                for causal in (False, True):
                    H, Hkv = 8, 2
                    q = torch.randn(1, H, S, d).to(dtype)
                    k, v = torch.randn(1, Hkv, S, d).to(dtype), torch.randn(1, Hkv, S, d).to(dtype)
                    t = interleaved({
                        "ours": lambda: mha.scaled_dot_product_attention(
                            q, k, v, is_causal=causal, enable_gqa=True),
                        "torch": lambda: F.scaled_dot_product_attention(
                            q, k, v, is_causal=causal, enable_gqa=True),
                    }, args.rounds, args.min_time)
                    flops = 4 * H * S * S * d * (0.5 if causal else 1.0)
                    rows.append((str(dtype).split(".")[1], d, S, "yes" if causal else "no",
                                 t["ours"] * 1e3, flops / t["ours"] / 1e9, t["torch"] * 1e3,
                                 t["torch"] / t["ours"]))
    return rows


def window_rows(args):
    rows = []
    S, H, Hkv, d = 4096, 8, 2, 64
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, H, S, d).to(dtype)
        k, v = torch.randn(1, Hkv, S, d).to(dtype), torch.randn(1, Hkv, S, d).to(dtype)
        t = interleaved({
            "window": lambda: mha.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               window=511, enable_gqa=True),
            "causal": lambda: mha.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               enable_gqa=True),
        }, args.rounds, args.min_time)
        rows.append((str(dtype).split(".")[1], t["window"] * 1e3, t["causal"] * 1e3,
                     t["causal"] / t["window"]))
    return rows


def decode_rows(args):
    rows = []
    H, Hkv, d = 32, 8, 128
    for dtype in (torch.float32, torch.bfloat16):
        for keys in (512, 2048, 8192):
            q = torch.randn(1, H, 1, d).to(dtype)
            k, v = torch.randn(1, Hkv, keys, d).to(dtype), torch.randn(1, Hkv, keys, d).to(dtype)
            t = interleaved({
                "ours": lambda: mha.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                "torch": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            }, args.rounds, args.min_time)
            cache_bytes = 2 * Hkv * keys * d * q.element_size()
            rows.append((str(dtype).split(".")[1], keys, t["ours"] * 1e3,
                         cache_bytes / t["ours"] / 1e9, t["torch"] * 1e3, t["torch"] / t["ours"]))
    return rows


def generate_rows(args):
    import transformers
    import mha.transformers  # noqa: F401

    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=4, num_attention_heads=8,
                                      num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    models = {}
    for name in ("mha", "sdpa"):
        models[name] = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=name).eval()
    models["mha"].load_state_dict(models["sdpa"].state_dict())
    prompt = torch.randint(1, 1000, (1, 128))
    new_tokens = 64

    def generate(model):
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=0)

    t = interleaved({name: (lambda m=m: generate(m)) for name, m in models.items()},
                    args.rounds, 0.0)
    return [(new_tokens / t["mha"], new_tokens / t["sdpa"], t["sdpa"] / t["mha"])]


def ceilings(args):
    """The floors' rates, measured in the same run: PyTorch's sgemm (and bf16 GEMM) at 2048³ in
    GFLOP/s, and a streaming read (the sum of 256 MiB of f32) in GB/s."""
    n = 2048
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        t = interleaved({"mm": lambda: torch.mm(a, b)}, args.rounds, args.min_time)["mm"]
        rows.append((f"{str(dtype).split('.')[1]} GEMM {n}³ GFLOP/s", 2 * n**3 / t / 1e9))
    x = torch.randn(64 * 1024 * 1024)
    t = interleaved({"sum": lambda: x.sum()}, args.rounds, args.min_time)["sum"]
    rows.append(("streaming read GB/s", x.numel() * 4 / t / 1e9))
    return rows


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(f"{x:.3f}" if isinstance(x, float) else str(x)
                                       for x in row) + " |")
    return "\n".join(lines)


def run_tables(description, caption, header, rows_of, rounds=5):
    """The main of a benchmark of one table: options (--threads, --rounds, --min-time, --out), the
    ceilings measured first, then rows_of(args, {ceiling: rate}) under "caption(args):"."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--out", help="also write the tables here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mha.set_num_threads(args.threads)
    rates = ceilings(args)
    text = ("Ceilings, measured in this run:\n\n" + table(["what", "rate"], rates) + "\n\n" +
            caption(args) + f" ({args.threads} threads, medians of {args.rounds} interleaved "
            "rounds):\n\n" + table(header, rows_of(args, dict(rates))) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 1024, 2048, 4096])
    ap.add_argument("--out")
    ap.add_argument("--plot", help="PNG of the prefill ratios")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mha.set_num_threads(args.threads)
    prefill = prefill_rows(args)
    sections = [
        "Ceilings, measured in this run:\n\n" + table(["what", "rate"], ceilings(args)),
        f"Prefill, B = 1, H = 8, Hkv = 2 ({args.threads} threads, medians of {args.rounds} "
        f"interleaved rounds):\n\n" + table(
            ["dtype", "d", "S", "causal", "ours ms", "ours GFLOP/s", "torch ms", "× torch"],
            prefill),
        "A sliding window of 512 at S = 4096, d = 64, against our full causal:\n\n" + table(
            ["dtype", "window ms", "causal ms", "×"], window_rows(args)),
        "One query, H = 32, Hkv = 8, d = 128, against a cache of N keys:\n\n" + table(
            ["dtype", "N", "ours ms", "ours GB/s of cache", "torch ms", "× torch"],
            decode_rows(args)),
        "generate() of a random Llama (4 layers, E = 256, 8 heads, 2 kv heads), prompt 128, "
        "64 new tokens:\n\n" + table(["mha tokens/s", "sdpa tokens/s", "×"], generate_rows(args)),
    ]
    text = "\n\n".join(sections) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4))
        for dtype in ("float32", "bfloat16"):
            for d in (64, 128):
                for causal in ("no", "yes"):
                    points = [(r[2], r[7]) for r in prefill
                              if r[0] == dtype and r[1] == d and r[3] == causal]
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                            label=f"{dtype} d={d} causal={causal}")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("× torch SDPA (higher is faster)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
