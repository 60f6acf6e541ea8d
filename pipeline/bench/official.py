"""Our MoCo v2 step against the official MoCo builder's step, same encoder, batch and queue.

    python -m pipeline.bench official --builder /path/to/moco/moco/builder.py
        [--batch 64 --size 32 --width 16 --K 4096 --rounds 15 --threads N]

``--builder``: moco/builder.py of github.com/facebookresearch/moco at commit 7397dfe (its later
commits delete the file), read from your checkout and never copied here. It is run as its
training script runs it (a process group, here of one gloo rank; cross-entropy on its logits),
with our ResNet as its ``base_encoder`` and ``mlp=True``. Its ShuffleBN shuffles across ranks,
so in one process its BN sees the whole batch: the leak the paper describes. Our step is
measured with the guard as the workflow runs it in one process (split BN, keys shuffled across
the sub-batches) and without it (``shuffle_bn: false``, ``bn_splits: 1``), which is the
official step's geometry. Rounds are interleaved; the spread of the per-round ratios shows
whether a difference is noise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
from typing import Any

import torch
from torch import nn

from pipeline.bench.step import optimizer_step, step_fn
from pipeline.bench.timing import cpu, interleaved, write
from pipeline.dag.config import section
from pipeline.methods.build import arch_of, build_model, build_optimizer
from pipeline.methods.section import Pretrain
from pipeline.nets.models import build_backbone, feature_dim


def load_official(path: str):
    spec = importlib.util.spec_from_file_location("official_moco_builder", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"[bench] cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def init_single_process_group() -> None:
    if not torch.distributed.is_initialized():
        store = tempfile.NamedTemporaryFile(prefix="moco-bench-", delete=False).name
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


def official_step(builder, p: Pretrain, size: int, x1, x2):
    def base_encoder(num_classes):
        backbone = build_backbone(arch_of(p, size))
        encoder = nn.Sequential()
        encoder.add_module("backbone", backbone)
        encoder.add_module("fc", nn.Linear(feature_dim(backbone), num_classes))
        return encoder

    model = builder.MoCo(base_encoder, dim=p.dim, K=p.K, m=p.m, T=p.T, mlp=True).train()
    criterion = nn.CrossEntropyLoss()
    return optimizer_step(lambda: criterion(*model(im_q=x1, im_k=x2)), build_optimizer(p, model.parameters()))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builder", required=True, help="the official moco/builder.py (commit 7397dfe)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--K", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if not os.path.isfile(args.builder):
        raise SystemExit(f"[bench] {args.builder} not found: give moco/builder.py of facebookresearch/moco@7397dfe")
    if args.threads:
        torch.set_num_threads(args.threads)
    # Both sides run on the CPU, on a GPU machine too: the official code's .cuda() calls (its
    # labels and key permutation) leave tensors where they are, or they would meet CPU logits
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    init_single_process_group()
    torch.manual_seed(0)
    p: dict[str, Any] = {
        "method": "moco",
        "variant": "v2",
        "backbone": "resnet18",
        "width": args.width,
        "cifar_stem": args.size <= 64,
        "dim": 128,
        "K": args.K,
        "m": 0.999,
        "T": 0.2,
        "epochs": 1,
        "batch_size": args.batch,
        "lr": 0.03,
        "weight_decay": 1e-4,
    }  # the official recipe's (the pretrain default is config.yaml's 5e-4)
    x1, x2 = torch.randn(args.batch, 3, args.size, args.size), torch.randn(args.batch, 3, args.size, args.size)
    labels, index = torch.randint(0, 10, (args.batch,)), torch.arange(args.batch)
    steps = {}
    variants: dict[str, dict[str, Any]] = {
        "supervised": {"method": "supervised"},
        "ours_guarded": {},
        "ours_unguarded": {"shuffle_bn": False, "bn_splits": 1},
    }
    for name, overrides in variants.items():
        cell = section("pretrain", {**p, **overrides})
        model = build_model(cell, args.size, num_classes=10, num_samples=20 * args.K).train()
        steps[name] = step_fn(model, build_optimizer(cell, model.parameters()), x1, x2, labels, index)
    steps["official"] = official_step(load_official(args.builder), section("pretrain", p), args.size, x1, x2)
    res = interleaved(steps, rounds=args.rounds)
    per_round = {
        name: [a / b for a, b in zip(res[name]["times_s"], res["official"]["times_s"])]
        for name in ("ours_guarded", "ours_unguarded")
    }
    sup = res["supervised"]["median_s"]
    result = {
        "batch": args.batch,
        "size": args.size,
        "width": args.width,
        "K": args.K,
        "threads": torch.get_num_threads(),
        "results": res,
        "ratio_vs_supervised": {k: round(v["median_s"] / sup, 3) for k, v in res.items()},
        "ratio_vs_official": {
            k: {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
            for k, v in per_round.items()
        },
    }
    path = write("official", result)
    c = cpu()
    print(
        f"resnet18 width {args.width}, batch {args.batch}, {args.size} px, K {args.K}, "
        f"{torch.get_num_threads()} threads; {c['model']} ({'AVX-512' if c['avx512'] else 'no AVX-512'}):"
    )
    for name, r in res.items():
        extra = ""
        if name in per_round:
            q = result["ratio_vs_official"][name]
            extra = f"  vs official x{q['median']:.3f} (rounds {q['min']:.3f}-{q['max']:.3f})"
        print(
            f"  {name:<15} {r['median_s']:.3f} s/step  x{result['ratio_vs_supervised'][name]:.3f} of supervised{extra}"
        )
    print(f"({path})")
    torch.distributed.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
