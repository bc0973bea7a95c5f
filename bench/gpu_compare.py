"""The GPU comparison: this project's CUDA kernels (mha_gpu_bench, device-resident tensors)
against PyTorch's F.linear + F.scaled_dot_product_attention on the same GPU, f32 (TF32 off),
then a table with GFLOP/s, the share of the GPU's FP32 peak and the ratio to PyTorch.

usage: gpu_compare.py --bench build/bench/mha_gpu_bench [--peak-tflops 67] [--out FILE]
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import report
import torch
import torch.nn.functional as F



def torch_ms(dims):
    B, Sq, Sk, E, H = dims
    d = E // H
    dev = torch.device("cuda")
    x = torch.rand(B, Sq, E, device=dev)
    kv = x if Sq == Sk else torch.rand(B, Sk, E, device=dev)
    w = [torch.rand(E, E, device=dev) / math.sqrt(E) for _ in range(4)]
    b = [torch.rand(E, device=dev) for _ in range(4)]

    def forward():
        q = F.linear(x, w[0], b[0]).view(B, Sq, H, d).transpose(1, 2)
        k = F.linear(kv, w[1], b[1]).view(B, Sk, H, d).transpose(1, 2)
        v = F.linear(kv, w[2], b[2]).view(B, Sk, H, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, Sq, E)
        return F.linear(o, w[3], b[3])

    with torch.inference_mode():
        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        times = []
        start = time.perf_counter()
        while len(times) < 5 or (len(times) < 50 and time.perf_counter() - start < 2):
            t = time.perf_counter()
            forward()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--peak-tflops", type=float, default=67.0, help="FP32 peak (H200: 67)")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    ours = []
    proc = subprocess.Popen([args.bench, "--device", "cuda"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        r = json.loads(line)
        print("ours:", line.strip(), file=sys.stderr, flush=True)
        ours.append(r)
    if proc.wait() != 0:
        sys.exit("mha_gpu_bench failed")

    lines = [f"GPU: {torch.cuda.get_device_name()}; PyTorch {torch.__version__}; f32, TF32 off; "
             f"FP32 peak taken as {args.peak_tflops} TFLOP/s",
             "",
             "| shape (B, Sq, Sk, E, H) | ours ms | ours TFLOP/s | % of FP32 peak | rel. L2 "
             "| PyTorch sdpa ms | × PyTorch |",
             "|---|---|---|---|---|---|---|"]
    for r in ours:
        dims = tuple(r["dims"])
        t = torch_ms(dims)
        tflops = report.flops(*dims) / (r["ms"] * 1e9)
        err = f"{r['rel_l2']:.1e}" if r["rel_l2"] >= 0 else "not checked"
        lines.append(f"| {', '.join(map(str, dims))} | {r['ms']:.3f} | {tflops:.2f} "
                     f"| {100 * tflops / args.peak_tflops:.1f}% | {err} | {t:.3f} "
                     f"| {t / r['ms']:.2f} |")
    report.publish(lines, args.out)


if __name__ == "__main__":
    main()
