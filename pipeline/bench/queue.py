"""Enqueue of a batch of keys into a K x dim queue: in-place ring buffer vs concatenation.

python -m pipeline.bench queue [--K 65536 --dim 128 --batch 256]
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

from pipeline.bench.timing import interleaved, write
from pipeline.methods.moco.queue import KeyQueue


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--K", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ring = KeyQueue(args.K, args.dim).to(device)
    keys = F.normalize(torch.randn(args.batch, args.dim, device=device), dim=1)
    source = torch.arange(args.batch, device=device)
    step = torch.zeros((), dtype=torch.long, device=device)
    state = {"queue": ring.keys.clone()}

    def concatenate():
        # the alternative: drop the oldest B keys, append the new ones (allocates K x dim)
        state["queue"] = torch.cat([state["queue"][args.batch :], keys], dim=0)

    res = interleaved(
        {"ring_buffer": lambda: ring.enqueue(keys, source, step), "concatenate": concatenate},
        rounds=args.rounds,
        warmup=5,
    )
    speedup = res["concatenate"]["median_s"] / res["ring_buffer"]["median_s"]
    result = {
        "K": args.K,
        "dim": args.dim,
        "batch": args.batch,
        "device": device,
        "results": res,
        "speedup_ring_vs_cat": round(speedup, 3),
    }
    path = write("queue", result)
    print(
        f"enqueue {args.batch} keys into K={args.K} x {args.dim} ({device}): ring "
        f"{res['ring_buffer']['median_s'] * 1e6:.1f} us, cat {res['concatenate']['median_s'] * 1e6:.1f} us "
        f"-> speedup x{speedup:.2f}  ({path})"
    )
    return result


if __name__ == "__main__":
    main()
