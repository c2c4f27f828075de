#!/usr/bin/env python3
"""CPU decode GEMMs for few rows: ATen's linear (x @ W^T + b) against the transposed form
(W @ x^T + b)^T, per shape and row count, on LibTorch's CPU BLAS. Groundwork for issue 40's
"pick the GEMM form per shape for small row counts": it shows which form wins where, and that no
single rule does. Shapes are OPT-125m's (q/k/v/out, fc1, fc2, LM head), float32.

  .venv/bin/python benchmarks/gemm_orientation.py [--threads 2] [--rows 1,4,8,16,32,64]
"""
import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = [(768, 768), (3072, 768), (768, 3072), (50272, 768)]  # (out, in)


def seconds_per_call(fn, reps):
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,4,8,16,32,64")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads; GB/s counts the weight's bytes once per call")
    print("| rows | out x in | linear ms | transposed ms | linear / transposed | linear GB/s | transposed GB/s |")
    print("|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        for out, inp in SHAPES:
            weight, bias, x = torch.randn(out, inp), torch.randn(out), torch.randn(rows, inp)
            linear = lambda: F.linear(x, weight, bias)  # noqa: E731  [rows, out]
            transposed = lambda: torch.addmm(bias.unsqueeze(1), weight, x.t()).t().contiguous()  # noqa: E731
            assert torch.allclose(linear(), transposed(), atol=1e-3, rtol=1e-4)
            reps = 20 if out > 10000 else 200
            a, b = seconds_per_call(linear, reps), seconds_per_call(transposed, reps)
            gb = weight.numel() * weight.element_size() / 1e9
            print(f"| {rows} | {out}x{inp} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f} | {gb / a:.1f} | {gb / b:.1f} |")


if __name__ == "__main__":
    main()
