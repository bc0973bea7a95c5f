"""Runs the whole comparison in one go and prints the table: the C++ benchmarks (this project's
kernels, OpenBLAS sgemm 2048³ as the ceiling, a hand-written BLAS multi-head attention, each
stage) and PyTorch's two paths, at the same thread counts, on this machine, now.

usage: compare.py --bench build/bench/mha_bench [--out FILE] [--filter REGEX] [--min-time S]
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

import report
import torch_peer

NAME = re.compile(r"^(?P<system>halide|blas)/B(?P<B>\d+)_Sq(?P<Sq>\d+)_Sk(?P<Sk>\d+)_E(?P<E>\d+)"
                  r"_H(?P<H>\d+)/weights:(?P<w>[01])/threads:(?P<t>\d+)")
STAGE = re.compile(r"^stage/(?P<stage>\w+)/(?P<shape>\w+)/threads:(?P<t>\d+)")
SGEMM = re.compile(r"^sgemm2048/threads:(?P<t>\d+)")



def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def run_cpp(bench, bench_filter, min_time):
    env = dict(os.environ)
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f " in f.read()
    # Debian's OpenBLAS 0.3.21 predates this CPU and falls back to its generic (Prescott)
    # kernels, about 6x slower; its own AVX-512 kernels are the machine's real BLAS ceiling.
    if avx512 and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = "SkylakeX"
    cmd = [bench, "--benchmark_format=json", f"--benchmark_min_time={min_time}",
           "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true",
           f"--benchmark_filter={bench_filter}"]
    print("running:", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE).stdout
    medians = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            ms = b["real_time"] * {"ms": 1, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
            medians[b["run_name"]] = (ms, b.get("label", ""))
    return medians, env.get("OPENBLAS_CORETYPE", "auto")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out")
    ap.add_argument("--filter", default=".")
    ap.add_argument("--min-time", type=float, default=0.2)
    args = ap.parse_args()

    started = time.time()
    cpp, coretype = run_cpp(args.bench, args.filter, args.min_time)
    sgemm = {int(SGEMM.match(n)["t"]): 2 * 2048**3 / (ms * 1e6)
             for n, (ms, _) in cpp.items() if SGEMM.match(n)}

    rows = {}
    for name, (ms, label) in cpp.items():
        m = NAME.match(name)
        if m:
            dims = tuple(int(m[k]) for k in ("B", "Sq", "Sk", "E", "H"))
            key = (dims, int(m["w"]), int(m["t"]))
            rows.setdefault(key, {})[m["system"]] = ms
            if m["system"] == "halide":
                rows[key]["isa"] = label
    for i, (dims, w, t) in enumerate(sorted(rows)):
        print(f"PyTorch {i + 1}/{len(rows)}: {dims} weights={w} threads={t}",
              file=sys.stderr, flush=True)
        rows[(dims, w, t)].update(torch_peer.measure(dims, bool(w), t, args.min_time))

    lines = []
    emit = lines.append
    emit(f"Machine: {cpu_model()}, {os.cpu_count()} cores; {platform.platform()}")
    emit(f"PyTorch {torch_peer.torch.__version__}; OpenBLAS core type {coretype}; "
         f"run took {time.time() - started:.0f} s")
    emit("")
    emit("Ceiling, OpenBLAS sgemm 2048³: " +
         ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.1f} GFLOP/s"
                   for t, g in sorted(sgemm.items())))
    emit("")
    emit("| shape (B, Sq, Sk, E, H) | weights | threads | ours ms | ours GFLOP/s | % of sgemm "
         "| BLAS MHA ms | nn.MHA ms | F.linear+sdpa ms | × BLAS MHA | × nn.MHA | × sdpa "
         "| × best PyTorch |")
    emit("|" + "---|" * 13)
    for (dims, w, t), r in sorted(rows.items(), key=lambda kv: (kv[0][0][3], kv[0][0][1] * kv[0][0][2], kv[0])):
        ours = r["halide"]
        gflops = report.flops(*dims) / (ours * 1e6)
        best_torch = min(r["nn.MultiheadAttention"], r["F.linear+sdpa"])
        emit(f"| {', '.join(map(str, dims))} | {'yes' if w else 'no'} | {t} | {ours:.3f} "
             f"| {gflops:.1f} | {100 * gflops / sgemm[t]:.0f}% | {r['blas']:.3f} "
             f"| {r['nn.MultiheadAttention']:.3f} | {r['F.linear+sdpa']:.3f} "
             f"| {r['blas'] / ours:.2f} | {r['nn.MultiheadAttention'] / ours:.2f} "
             f"| {r['F.linear+sdpa'] / ours:.2f} | {best_torch / ours:.2f} |")
    stages = {}
    for name, (ms, _) in cpp.items():
        m = STAGE.match(name)
        if m:
            stages.setdefault(m["shape"], {})[m["stage"]] = ms
    if stages:
        names = ["linear_projection", "split_heads", "scaled_scores", "masked_softmax",
                 "attend_values", "merge_heads"]
        emit("")
        emit("Each stage's own library alone (simple schedules; 2 threads), ms:")
        emit("")
        emit("| shape | " + " | ".join(names) + " |")
        emit("|" + "---|" * (len(names) + 1))
        for shape, st in sorted(stages.items()):
            emit(f"| {shape} | " + " | ".join(f"{st.get(n, float('nan')):.3f}" for n in names) + " |")
    report.publish(lines, args.out)


if __name__ == "__main__":
    main()
