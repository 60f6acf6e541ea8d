"""A detection fine-tuning step (Mask R-CNN or Faster R-CNN, as detect.task) in fp32 and on the
fast path (bf16 autocast, detect.fast_path), side by side in one run; and the evaluation forward.

    python -m pipeline.bench detection [--configfile PRESET ...] [--rounds 5] [--threads 1]

The detector is the workflow's (pipeline.transfer.model.build_detector) at the config's detect
settings (config.yaml, then each --configfile over it), on a randomly initialised backbone of the
base cell's architecture; one batch of the embedded scenes (generated into a temporary folder).
A trial's time is its steps plus one evaluation, so ``fp32 / fast path`` of the step is what the
fast path takes off a trial's fine-tuning. The evaluation runs in fp32 on either path
(pipeline.transfer.trial), so it is timed once.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from pipeline.bench.timing import interleaved, write
from pipeline.dag.config import load_yaml, merge, section
from pipeline.nets.fast_path import bf16_autocast
from pipeline.nets.models import build_backbone
from pipeline.transfer.data import CocoBoxes, collate
from pipeline.transfer.model import build_detector

DEFAULT_CONFIG = Path("workflow/config/config.yaml")


def scenes(root: Path, cfg: dict, count: int):
    """``count`` training scenes of the embedded data at the config's settings, as one batch."""
    from pipeline import synthetic
    from pipeline.data.detection import load_splits

    synthetic.run(root, section("dataset", cfg["dataset"]).synthetic, progress=False)
    train, _ = load_splits(root / "det")
    data = CocoBoxes(train, masks=cfg["detect"]["task"] == "segmentation")
    return collate([data[i] for i in range(count)])


def step_fn(detector, images, targets, fast: bool):
    opt = torch.optim.SGD([p for p in detector.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)

    def step():
        detector.train()
        with bf16_autocast("cpu", fast):
            loss = sum(detector(list(images), list(targets)).values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", nargs="*", default=[], help="presets over config.yaml (e.g. the transfer preset)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_yaml(DEFAULT_CONFIG)
    for extra in args.configfile:
        cfg = merge(cfg, load_yaml(extra))
    dc, p = section("detect", cfg["detect"]), section("pretrain", cfg["pretrain"])
    with tempfile.TemporaryDirectory() as tmp:
        images, targets = scenes(Path(tmp), cfg, dc.batch_size)
    arch = {"backbone": p.backbone, "width": p.width, "cifar_stem": p.cifar_stem}
    torch.manual_seed(0)
    ckpt = {"arch": arch, "method": "random", "backbone": build_backbone(arch).state_dict()}
    detectors = {path: build_detector(ckpt, dc, 11, "random init") for path in ("fp32", "fast")}
    candidates = {f"step {path}": step_fn(det, images, targets, fast=path == "fast") for path, det in detectors.items()}
    evaluation = detectors["fp32"]

    def evaluate():
        evaluation.eval()
        with torch.no_grad():
            evaluation(list(images))

    candidates["evaluation forward (fp32)"] = evaluate
    res = interleaved(candidates, rounds=args.rounds)
    speedup = round(res["step fp32"]["median_s"] / res["step fast"]["median_s"], 3)
    result = {
        "task": dc.task,
        "head": dc.head,
        "image_size": dc.image_size,
        "batch_size": dc.batch_size,
        "threads": torch.get_num_threads(),
        "results": res,
        "step_fp32_over_fast_path": speedup,
    }
    path = write("detection", result)
    print(f"{dc.task}, head {dc.head}, {dc.image_size} px, batch {dc.batch_size}, {torch.get_num_threads()} threads:")
    for name, r in res.items():
        print(f"  {name:<26} {r['median_s']:.3f} s")
    print(f"  step fp32 / fast path: {speedup:.3f}x  ({path})")
    return result


if __name__ == "__main__":
    main()
