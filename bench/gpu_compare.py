"""The GPU comparison: this project's CUDA kernels (mha_gpu_bench, device-resident tensors)
against PyTorch on the same GPU, f32 (TF32 off): F.linear + F.scaled_dot_product_attention and
nn.MultiheadAttention without the weights; nn.MultiheadAttention(need_weights=True,
average_attn_weights=False) against ours returning the weights. Prints, and writes with --out,
a table with TFLOP/s, the share of the GPU's FP32 (non-tensor-core) peak and the ratios; then
the same for bf16 and f16 modules (the dtype sweep) against PyTorch in that dtype.

usage: gpu_compare.py --bench ./mha_gpu_bench [--peak-tflops 67] [--out FILE] [--shapes ...]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import report
import torch
import torch.nn.functional as F


def cuda_ms(call):
    """Median milliseconds of `call` on the GPU: 3 warm-ups, then at least 5 and up to 50 calls
    within 2 seconds, each synchronized."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (len(times) < 50 and time.perf_counter() - start < 2):
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def torch_ms(dims, dtype="f32"):
    """PyTorch's times for one (B, Sq, Sk, E, H) in `dtype`: {peer name: ms} (16-bit: its
    tensor-core matmuls; the weights returned in f32 only)."""
    B, Sq, Sk, E, H = dims
    d = E // H
    dev, t = torch.device("cuda"), DTYPES[dtype]
    x = torch.rand(B, Sq, E, device=dev, dtype=t)
    kv = x if Sq == Sk else torch.rand(B, Sk, E, device=dev, dtype=t)
    module = torch.nn.MultiheadAttention(E, H, batch_first=True, device=dev, dtype=t).eval()
    w = list(module.in_proj_weight.detach().chunk(3)) + [module.out_proj.weight.detach()]
    b = list(module.in_proj_bias.detach().chunk(3)) + [module.out_proj.bias.detach()]

    def functional():
        q = F.linear(x, w[0], b[0]).view(B, Sq, H, d).transpose(1, 2)
        k = F.linear(kv, w[1], b[1]).view(B, Sk, H, d).transpose(1, 2)
        v = F.linear(kv, w[2], b[2]).view(B, Sk, H, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, Sq, E)
        return F.linear(o, w[3], b[3])

    with torch.inference_mode():
        times = {
            "sdpa": cuda_ms(functional),
            "mha": cuda_ms(lambda: module(x, kv, kv, need_weights=False)),
        }
        if dtype == "f32":
            times["mha_weights"] = cuda_ms(lambda: module(x, kv, kv, need_weights=True,
                                                          average_attn_weights=False))
        return times


def ours(bench, shapes, weights, dtype="f32"):
    """mha_gpu_bench's JSON lines, by shape (no shapes: its sweep of that dtype)."""
    command = [bench, "--device", "cuda", "--max-check-gflop", "4", "--dtype", dtype]
    command += [f"--shapes={','.join(map(str, s))}" for s in shapes]
    if weights:
        command.append("--weights")
    result = {}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            print("ours:", line.strip(), file=sys.stderr, flush=True)
            r = json.loads(line)
            result[tuple(r["dims"])] = r
    if proc.returncode != 0:
        sys.exit("mha_gpu_bench failed")
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--peak-tflops", type=float, default=67.0, help="FP32 peak (H200: 67)")
    ap.add_argument("--shapes", nargs="*", default=[],
                    help="B,Sq,Sk,E,H ... (default: mha_gpu_bench's sweep)")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]

    plain = ours(args.bench, shapes, weights=False)
    with_weights = ours(args.bench, list(plain), weights=True)
    props = torch.cuda.get_device_properties(0)
    lines = [f"GPU: {props.name}; PyTorch {torch.__version__} (CUDA {torch.version.cuda}); "
             f"f32, TF32 off; FP32 peak taken as {args.peak_tflops} TFLOP/s",
             "",
             "| shape (B, Sq, Sk, E, H) | ours ms | ours TFLOP/s | % FP32 peak | rel. L2 "
             "| F.linear+sdpa ms | × sdpa | nn.MHA ms | × nn.MHA | ours +weights ms "
             "| nn.MHA +weights ms | × nn.MHA +weights |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dims, r in plain.items():
        peers = torch_ms(dims)
        tflops = report.flops(*dims) / (r["ms"] * 1e9)
        err = f"{r['rel_l2']:.1e}" if r["rel_l2"] >= 0 else "not checked"
        rw = with_weights[dims]
        lines.append(
            f"| {', '.join(map(str, dims))} | {r['ms']:.3f} | {tflops:.2f} "
            f"| {100 * tflops / args.peak_tflops:.1f}% | {err} | {peers['sdpa']:.3f} "
            f"| {peers['sdpa'] / r['ms']:.2f} | {peers['mha']:.3f} | {peers['mha'] / r['ms']:.2f} "
            f"| {rw['ms']:.3f} | {peers['mha_weights']:.3f} "
            f"| {peers['mha_weights'] / rw['ms']:.2f} |")
        print("row:", lines[-1], file=sys.stderr, flush=True)  # kept if the run is cut short
    # 16-bit modules: our kernels read bf16 / f16 and compute in f32 (no tensor cores);
    # PyTorch's matmuls in that dtype run on tensor cores.
    lines += ["",
              "| shape (B, Sq, Sk, E, H) | dtype | ours ms | ours TFLOP/s | % FP32 peak | rel. L2 "
              "| F.linear+sdpa ms | × sdpa | nn.MHA ms | × nn.MHA |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for dtype in ("bf16", "f16"):
        for dims, r in ours(args.bench, shapes, weights=False, dtype=dtype).items():
            peers = torch_ms(dims, dtype)
            tflops = report.flops(*dims) / (r["ms"] * 1e9)
            err = f"{r['rel_l2']:.1e}" if r["rel_l2"] >= 0 else "not checked"
            lines.append(
                f"| {', '.join(map(str, dims))} | {dtype} | {r['ms']:.3f} | {tflops:.2f} "
                f"| {100 * tflops / args.peak_tflops:.1f}% | {err} | {peers['sdpa']:.3f} "
                f"| {peers['sdpa'] / r['ms']:.2f} | {peers['mha']:.3f} "
                f"| {peers['mha'] / r['ms']:.2f} |")
            print("row:", lines[-1], file=sys.stderr, flush=True)
    report.publish(lines, args.out)


if __name__ == "__main__":
    main()
