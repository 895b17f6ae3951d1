#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the prefill shapes of
simdattn_bench, counted the same way (4 x B x Hq x D x visible query-key
pairs), so that its GFLOP/s sit beside the bench's in one table.

Usage: bench/torch_sdpa.py [--threads 1,16] [--dtype bf16,f32] [--seconds 2]
Prints one line per entry: shape, mask, dtype, threads, median ms, GFLOP/s.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [  # (B, H, L, D)
    (1, 8, 2048, 128),
    (4, 16, 256, 64),
]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def visible_pairs(length, causal):
    return length * (length + 1) / 2 if causal else float(length * length)


def time_call(fn, seconds):
    fn()  # warm-up: first touch, kernel selection
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1")
    parser.add_argument("--dtype", default="bf16,f32")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if not hasattr(F, "scaled_dot_product_attention"):
        raise SystemExit(f"torch {torch.__version__} has no scaled_dot_product_attention "
                         "(PyTorch 2.0 or later)")
    print(f"torch {torch.__version__}")
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name in args.dtype.split(","):
            dtype = DTYPES[name]
            for b, h, length, d in SHAPES:
                gen = torch.Generator().manual_seed(1)
                q, k, v = (torch.rand(b, h, length, d, generator=gen, dtype=torch.float32)
                           .mul_(2).sub_(1).to(dtype) for _ in range(3))
                for causal in (False, True):
                    def call():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    sec = time_call(call, args.seconds)
                    flops = 4.0 * b * h * d * visible_pairs(length, causal)
                    mask = "causal" if causal else "none"
                    print(f"torch {name} B{b}_Hq{h}_L{length}_D{d} {mask} threads:{threads} "
                          f"{sec * 1e3:.2f} ms {flops / sec / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
