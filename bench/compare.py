"""Runs the whole comparison in one go and prints the tables: the C++ benchmarks (this project's
kernels, OpenBLAS sgemm 2048³ and a streaming read as the ceilings, a hand-written BLAS
multi-head attention, each stage, decode steps over a KV cache), PyTorch's paths and ONNX
Runtime's, at the same thread counts, on this machine, now. PyTorch and ONNX Runtime are timed
from Python (median of calls); their Python call overhead is printed beside them. Everything is
measured in --rounds interleaved rounds (the machine is shared and drifts); each figure is the
median of its rounds. Ours is timed twice: the C++ benchmark, and through the Python package
(mha.MultiheadAttention, which `pip install .` installs), which pays the same kind of call as
the Python peers; the "× faster peer" ratios are given for both.

usage: compare.py --bench build/bench/mha_bench [--out FILE] [--plot PNG] [--filter REGEX]
                  [--min-time S] [--rounds N]
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import ort_peer
import plot
import python_peer
import report
import torch_peer

NAME = re.compile(r"^(?P<system>halide|blas)/B(?P<B>\d+)_Sq(?P<Sq>\d+)_Sk(?P<Sk>\d+)_E(?P<E>\d+)"
                  r"_H(?P<H>\d+)/weights:(?P<w>[01])/threads:(?P<t>\d+)")
STAGE = re.compile(r"^stage/(?P<stage>\w+)/(?P<shape>\w+)/threads:(?P<t>\d+)")
SGEMM = re.compile(r"^sgemm2048/threads:(?P<t>\d+)")
STREAM = re.compile(r"^stream_read/MB:(?P<mb>\d+)/threads:(?P<t>\d+)")
BF16_DOT = re.compile(r"^bf16dot/threads:(?P<t>\d+)")  # 2^24 vdpbf16ps of 64 FLOPs per thread
DECODE = re.compile(r"^decode/B(?P<B>\d+)_N(?P<N>\d+)_E(?P<E>\d+)_H(?P<H>\d+)(_KV(?P<kv>\d+))?"
                    r"/threads:(?P<t>\d+)")
GQA = re.compile(r"^gqa/B(?P<B>\d+)_Sq(?P<Sq>\d+)_Sk(?P<Sk>\d+)_E(?P<E>\d+)_H(?P<H>\d+)"
                 r"_kv(?P<kv>\d+)/threads:(?P<t>\d+)")
DTYPE = re.compile(r"^dtype/B(?P<B>\d+)_Sq(?P<Sq>\d+)_Sk(?P<Sk>\d+)_E(?P<E>\d+)_H(?P<H>\d+)"
                   r"/dtype:(?P<dtype>\w+)/threads:(?P<t>\d+)")
CAUSAL = re.compile(r"^causal/B(?P<B>\d+)_Sq(?P<Sq>\d+)_Sk(?P<Sk>\d+)_E(?P<E>\d+)_H(?P<H>\d+)"
                    r"/mode:(?P<mode>\w+)/threads:(?P<t>\d+)")



def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def blas_environment():
    env = dict(os.environ)
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f " in f.read()
    # Debian's OpenBLAS 0.3.21 predates this CPU and falls back to its generic (Prescott)
    # kernels, about 6x slower; its own AVX-512 kernels are the machine's real BLAS ceiling.
    if avx512 and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = "SkylakeX"
    return env


def run_cpp(bench, names, min_time, env):
    """{name: (ms, label, the benchmark's JSON)} of the named C++ benchmarks, run once."""
    pattern = "^(" + "|".join(map(re.escape, names)) + ")$"
    cmd = [bench, "--benchmark_format=json", f"--benchmark_min_time={min_time}",
           f"--benchmark_filter={pattern}"]
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE).stdout
    results = {}
    for b in json.loads(out)["benchmarks"]:
        ms = b["real_time"] * {"ms": 1, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        results[b["run_name"]] = (ms, b.get("label", ""), b)
    return results


def benchmark_groups(bench, bench_filter):
    """The C++ benchmarks' names in groups, each timed right before its peers so that both see
    the same phase of a shared machine: one per forward shape, one per decode shape, one for the
    rest (ceilings, stages)."""
    names = subprocess.run([bench, "--benchmark_list_tests=true",
                            f"--benchmark_filter={bench_filter}"],
                           check=True, stdout=subprocess.PIPE, text=True).stdout.split()
    groups = {}
    for name in names:
        forward, decode, causal = NAME.match(name), DECODE.match(name), CAUSAL.match(name)
        key = (("forward", forward_dims(forward)) if forward else
               ("decode", decode_shape(decode)) if decode else
               ("causal", forward_dims(causal)) if causal else
               ("dtype", forward_dims(DTYPE.match(name))) if DTYPE.match(name) else
               ("gqa", name) if GQA.match(name) else ("other",))
        groups.setdefault(key, []).append(name)
    return groups


def forward_dims(m):
    return tuple(int(m[k]) for k in ("B", "Sq", "Sk", "E", "H"))


def decode_shape(m):
    """(B, N, E, H, key/value heads)."""
    return tuple(int(m[k]) for k in ("B", "N", "E", "H")) + (int(m["kv"] or m["H"]),)


def one_round(args, groups, env, label):
    """Every measurement once, group by group: the C++ benchmarks, then their peers. Returns
    {key: milliseconds} and the C++ results."""
    cpp, times = {}, {}
    for g, (key, names) in enumerate(groups.items()):
        print(f"{label}, group {g + 1}/{len(groups)}: {' '.join(map(str, key))}", file=sys.stderr,
              flush=True)
        results = run_cpp(args.bench, names, args.min_time, env)
        cpp.update(results)
        for name in results:
            forward, decode = NAME.match(name), DECODE.match(name)
            if forward and forward["system"] == "halide":
                dims, w, t = forward_dims(forward), int(forward["w"]), int(forward["t"])
                for path, ms in torch_peer.measure(dims, bool(w), t, args.min_time).items():
                    times[(path, dims, w, t)] = ms
                times[("python", dims, w, t)] = python_peer.measure(dims, bool(w), t,
                                                                    args.min_time)
                if not w:  # ORT's attention ops do not return the weights
                    times[("ort", dims, w, t)] = ort_peer.measure(dims, t, args.min_time)
            elif GQA.match(name):
                g = GQA.match(name)
                dims, kv, t = forward_dims(g), int(g["kv"]), int(g["t"])
                times[("torch gqa", dims, kv, t)] = torch_peer.measure_gqa(dims, kv, t,
                                                                           args.min_time)
            elif DTYPE.match(name):
                m = DTYPE.match(name)
                dims, dtype, t = forward_dims(m), m["dtype"], int(m["t"])
                for path, ms in torch_peer.measure_dtype(dims, dtype, t, args.min_time).items():
                    times[(f"torch {path}", dims, dtype, t)] = ms
                if dtype in ort_peer.ORT_DTYPES:
                    times[("ort", dims, dtype, t)] = ort_peer.measure(dims, t, args.min_time, dtype)
            elif CAUSAL.match(name) and CAUSAL.match(name)["mode"] == "implicit":
                dims, t = forward_dims(CAUSAL.match(name)), int(CAUSAL.match(name)["t"])
                times[("torch causal", dims, t)] = torch_peer.measure_causal(dims, t,
                                                                             args.min_time)
            elif decode:
                shape, t = decode_shape(decode), int(decode["t"])
                *dims, kv_heads = shape
                times[("torch decode", shape, t)] = torch_peer.measure_decode(
                    *dims, t, args.min_time, kv_heads=kv_heads)
                # ONNX Runtime: MultiHeadAttention, or GroupQueryAttention over grouped heads.
                # Our Python module has no grouped heads.
                if kv_heads != dims[3]:
                    times[("ort decode", shape, t)] = ort_peer.measure_decode_gqa(
                        *dims, kv_heads, t, args.min_time)
                else:
                    times[("ort decode", shape, t)] = ort_peer.measure_decode(*dims, t,
                                                                              args.min_time)
                    times[("python decode", shape, t)] = python_peer.measure_decode(
                        *dims, t, args.min_time)
    times.update({("cpp", name): ms for name, (ms, _, _) in cpp.items()})
    for t in sorted({int(m["t"]) for m in map(NAME.match, cpp) if m}):
        times[("torch overhead", t)] = torch_peer.call_overhead_ms(t)
        times[("ort overhead", t)] = ort_peer.call_overhead_ms(t)
        times[("python overhead", t)] = python_peer.call_overhead_ms(t)
    return times, cpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out")
    ap.add_argument("--plot", help="PNG of time and ratio per shape against every peer")
    ap.add_argument("--filter", default=".")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of everything; each figure is their median")
    args = ap.parse_args()

    started = time.time()
    env = blas_environment()
    coretype = env.get("OPENBLAS_CORETYPE", "auto")
    groups = benchmark_groups(args.bench, args.filter)
    rounds = []
    for r in range(args.rounds):
        times, cpp = one_round(args, groups, env, f"round {r + 1}/{args.rounds}")
        rounds.append(times)
    ms = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    cpp_ms = {name: ms[("cpp", name)] for name in cpp}

    sgemm = {int(SGEMM.match(n)["t"]): 2 * 2048**3 / (t * 1e6)
             for n, t in cpp_ms.items() if SGEMM.match(n)}
    stream = {int(STREAM.match(n)["t"]): int(STREAM.match(n)["mb"]) * 2**20 / (t * 1e6)
              for n, t in cpp_ms.items() if STREAM.match(n)}  # GB/s
    bf16_dot = {int(BF16_DOT.match(n)["t"]): 64 * 2**24 * int(BF16_DOT.match(n)["t"]) / (t * 1e6)
                for n, t in cpp_ms.items() if BF16_DOT.match(n)}  # GFLOP/s
    rows = {}
    for name, t_ms in cpp_ms.items():
        m = NAME.match(name)
        if m:
            key = (forward_dims(m), int(m["w"]), int(m["t"]))
            row = rows.setdefault(key, {"isa": cpp[name][1]})
            row[m["system"]] = t_ms
            for path in ("nn.MultiheadAttention", "F.linear+sdpa", "ort", "python"):
                if (path, *key) in ms:
                    row[path] = ms[(path, *key)]
    decode = {}
    for name, t_ms in cpp_ms.items():
        m = DECODE.match(name)
        if m:
            shape, t = decode_shape(m), int(m["t"])
            decode[(shape, t)] = {"ours": t_ms, "bytes": cpp[name][2]["bytes"],
                                  "torch": ms[("torch decode", shape, t)],
                                  "ort": ms.get(("ort decode", shape, t)),
                                  "python": ms.get(("python decode", shape, t))}
    overhead = {t: (ms[("torch overhead", t)], ms[("ort overhead", t)], ms[("python overhead", t)])
                for t in sorted({t for (_, _, t) in rows})}

    lines = []
    emit = lines.append
    emit(f"Machine: {cpu_model()}, {os.cpu_count()} cores; {platform.platform()}")
    emit(f"PyTorch {torch_peer.torch.__version__}, ONNX Runtime {ort_peer.ort.__version__}; "
         f"OpenBLAS core type {coretype}; median of {args.rounds} interleaved rounds; "
         f"run took {time.time() - started:.0f} s")
    emit("")
    emit("Ceiling, OpenBLAS sgemm 2048³: " +
         ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.1f} GFLOP/s"
                   for t, g in sorted(sgemm.items())))
    if bf16_dot:
        emit("Ceiling, vdpbf16ps on independent accumulators: " +
             ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.1f} GFLOP/s"
                       for t, g in sorted(bf16_dot.items())))
    emit("Streaming read (256 MB summed): " +
         ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.1f} GB/s" for t, g in sorted(stream.items())))
    emit("Python call overhead, the cheapest call: " +
         ", ".join(f"{t} thread{'s' if t > 1 else ''}: PyTorch {p:.4f} ms, ONNX Runtime {o:.4f} ms"
                   for t, (p, o, _) in overhead.items()) +
         "; what mha.MultiheadAttention adds to its C++ call (one token, E = 384): " +
         ", ".join(f"{y:.4f} ms" for _, _, y in overhead.values()))
    emit("")
    if rows:
        emit("| shape (B, Sq, Sk, E, H) | weights | threads | ours ms | ours GFLOP/s | % of sgemm "
             "| BLAS MHA ms | nn.MHA ms | F.linear+sdpa ms | ONNX Runtime ms | × BLAS MHA "
             "| × best PyTorch | × ONNX Runtime | × faster peer | ours from Python ms "
             "| × faster peer, from Python |")
        emit("|" + "---|" * 16)
        for (dims, w, t), r in sorted(rows.items(), key=lambda kv: (kv[0][0][3], kv[0][0][1] * kv[0][0][2], kv[0])):
            ours = r["halide"]
            gflops = report.flops(*dims) / (ours * 1e6)
            best_torch = min(r["nn.MultiheadAttention"], r["F.linear+sdpa"])
            ort_ms = r.get("ort")
            faster = min(best_torch, ort_ms) if ort_ms else best_torch
            emit(f"| {', '.join(map(str, dims))} | {'yes' if w else 'no'} | {t} | {ours:.3f} "
                 f"| {gflops:.1f} | {100 * gflops / sgemm[t]:.0f}% | {r['blas']:.3f} "
                 f"| {r['nn.MultiheadAttention']:.3f} | {r['F.linear+sdpa']:.3f} "
                 f"| {f'{ort_ms:.3f}' if ort_ms else '–'} | {r['blas'] / ours:.2f} "
                 f"| {best_torch / ours:.2f} | {f'{ort_ms / ours:.2f}' if ort_ms else '–'} "
                 f"| {faster / ours:.2f} | {r['python']:.3f} | {faster / r['python']:.2f} |")
    if decode:
        emit("")
        emit("Decode steps (one new token per batch row against a KV cache of N tokens); floor = "
             "bytes read (weights + cache) / the same run's streaming read:")
        emit("")
        emit("| B, N, E, H, KV heads | threads | ours ms | floor ms | × floor | PyTorch ms "
             "| ONNX Runtime ms | × PyTorch | × ONNX Runtime | × faster peer | ours from Python ms "
             "| × faster peer, from Python |")
        emit("|" + "---|" * 12)

        def cell(value):
            return f"{value:.3f}" if value else "–"

        def ratio(peer, ours):
            return f"{peer / ours:.2f}" if peer and ours else "–"
        for (shape, t), r in sorted(decode.items(), key=lambda kv: (kv[0][0][2], kv[0][0][1], kv[0][1])):
            floor = r["bytes"] / (stream[t] * 1e6)
            faster = min(x for x in (r["torch"], r["ort"]) if x)
            emit(f"| {', '.join(map(str, shape))} | {t} | {r['ours']:.3f} | {floor:.3f} "
                 f"| {r['ours'] / floor:.2f} | {r['torch']:.3f} | {cell(r['ort'])} "
                 f"| {r['torch'] / r['ours']:.2f} | {ratio(r['ort'], r['ours'])} "
                 f"| {faster / r['ours']:.2f} | {cell(r['python'])} "
                 f"| {ratio(faster, r['python'])} |")
    causal = {}
    for name, t_ms in cpp_ms.items():
        m = CAUSAL.match(name)
        if m:
            key = (forward_dims(m), int(m["t"]))
            causal.setdefault(key, {"torch": ms[("torch causal", *key)]})[m["mode"]] = t_ms
    if causal:
        emit("")
        emit("Causal self-attention (top-left): ours with ForwardOptions::causal (hidden key tiles "
             "skipped), with an explicit boolean [Sq, Sk] attn_mask, and without causality; "
             "PyTorch F.linear + F.scaled_dot_product_attention(is_causal=True). Floor ratio: "
             "FLOPs with a full mask over FLOPs with half the attention skipped.")
        emit("")
        emit("| shape (B, Sq, Sk, E, H) | threads | causal ms | explicit mask ms | no mask ms "
             "| PyTorch ms | × explicit mask | floor × | × PyTorch |")
        emit("|" + "---|" * 9)
        for (dims, t), r in sorted(causal.items()):
            B, Sq, Sk, E, H = dims
            attention = 4 * B * Sq * Sk * E
            full = report.flops(*dims)
            emit(f"| {', '.join(map(str, dims))} | {t} | {r['implicit']:.3f} "
                 f"| {r['explicit_mask']:.3f} | {r['none']:.3f} | {r['torch']:.3f} "
                 f"| {r['explicit_mask'] / r['implicit']:.2f} "
                 f"| {full / (full - attention / 2):.2f} | {r['torch'] / r['implicit']:.2f} |")
    gqa = {}
    for name, t_ms in cpp_ms.items():
        m = GQA.match(name)
        if m:
            key = (forward_dims(m), int(m["kv"]), int(m["t"]))
            gqa[key] = (t_ms, ms[("torch gqa", *key)])
    if gqa:
        emit("")
        emit("Grouped-query self-attention: ours (kv_heads key/value heads) against PyTorch "
             "F.linear + F.scaled_dot_product_attention(enable_gqa=True):")
        emit("")
        emit("| shape (B, Sq, Sk, E, H) | kv heads | threads | ours ms | PyTorch ms | × PyTorch |")
        emit("|" + "---|" * 6)
        for (dims, kv, t), (ours, peer) in sorted(gqa.items()):
            emit(f"| {', '.join(map(str, dims))} | {kv} | {t} | {ours:.3f} | {peer:.3f} "
                 f"| {peer / ours:.2f} |")
    dtypes = {}
    for name, t_ms in cpp_ms.items():
        m = DTYPE.match(name)
        if m:
            key = (forward_dims(m), m["dtype"], int(m["t"]))
            dtypes[key] = {"ours": t_ms, "kernel": cpp[name][1]}
            dtypes[key].update({path: ms[(path, *key)] for path in
                                ("torch module", "torch linear+sdpa", "torch autocast", "ort")
                                 if (path, *key) in ms})
    if dtypes:
        order = ["f32", "bf16", "f16"]
        emit("")
        emit("Self-attention in each dtype (no weights): ours, a module of that dtype on tensors of "
             "it; PyTorch nn.MultiheadAttention of that dtype, F.linear + "
             "F.scaled_dot_product_attention in it, and for bf16 the f32 module under "
             "torch.autocast(cpu, bfloat16); ONNX Runtime's Attention in that type where its CPU "
             "provider has one (not bf16). Ceiling: the same run's vdpbf16ps peak for bf16, "
             "sgemm for the others:")
        emit("")
        emit("| shape (B, Sq, Sk, E, H) | dtype | threads | ours ms | ours GFLOP/s | % of ceiling "
             "| × our f32 "
             "| PyTorch module ms | F.linear+sdpa ms | PyTorch autocast ms | ONNX Runtime ms "
             "| × best PyTorch | × ONNX Runtime | kernel |")
        emit("|" + "---|" * 14)
        for (dims, dtype, t), r in sorted(dtypes.items(),
                                         key=lambda kv: (kv[0][0], order.index(kv[0][1]), kv[0][2])):
            ours = r["ours"]
            # The f32 row of the shape, when the filter kept it.
            f32 = dtypes.get((dims, "f32", t), {}).get("ours")
            best_torch = min(r["torch module"], r["torch linear+sdpa"],
                             r.get("torch autocast", float("inf")))
            autocast, ort_ms = r.get("torch autocast"), r.get("ort")
            gflops = report.flops(*dims) / (ours * 1e6)
            ceiling = (bf16_dot if dtype == "bf16" else sgemm).get(t)
            emit(f"| {', '.join(map(str, dims))} | {dtype} | {t} | {ours:.3f} | {gflops:.1f} "
                 f"| {f'{100 * gflops / ceiling:.0f}%' if ceiling else '–'} "
                 f"| {f'{f32 / ours:.2f}' if f32 else '–'} "
                 f"| {r['torch module']:.3f} | {r['torch linear+sdpa']:.3f} "
                 f"| {f'{autocast:.3f}' if autocast else '–'} "
                 f"| {f'{ort_ms:.3f}' if ort_ms else '–'} | {best_torch / ours:.2f} "
                 f"| {f'{ort_ms / ours:.2f}' if ort_ms else '–'} | {r['kernel']} |")
    stages = {}
    for name, t_ms in cpp_ms.items():
        m = STAGE.match(name)
        if m:
            stages.setdefault(m["shape"], {})[m["stage"]] = t_ms
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
    if args.plot:
        plot.comparison(rows, decode, f"{cpu_model()}, {os.cpu_count()} cores; median of "
                        f"{args.rounds} rounds", args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
