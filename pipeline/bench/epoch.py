"""One pretraining epoch taken apart: model steps, loader, photometric recipe, the real epoch.

    python -m pipeline.bench epoch [--configfile preset.yaml ...] [--data results/data/ffcv]
                                   [--rounds 3] [--threads N]

Builds the base cell's Trainer (the pretrain section of workflow/config/config.yaml, with any
``--configfile`` layered over it as Snakemake does) on the converted dataset and
times, interleaved round after round so that a shared machine's noise hits all alike:

- model:  optimisation steps on one epoch of already augmented views held in memory;
- loader: one epoch of the two-view loader alone (decode + seeded crops + flips);
- recipe: the two views' photometric recipes alone on one epoch of loaded batches;
- real:   the epoch as pretraining runs it (loader -> recipe -> step).

Prints each as seconds per epoch and the ratio real / model (the data path's overhead on the
model; keep it <= 1.25). Compilation and first-epoch costs are left out (one warm-up round):
they are per job, and a workflow run attributes them (python -m pipeline.bench pipeline).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from pipeline.bench.timing import cpu, interleaved, write
from pipeline.dag.config import DEFAULT_CONFIG, load_stage_config, load_yaml, merge
from pipeline.runtime import distributed

TARGET = 1.25  # real epoch / model steps


def base_cell_config(configfiles=()) -> dict:
    """data + pretrain of the workflow's config with ``configfiles`` merged over it, validated."""
    cfg = load_yaml(DEFAULT_CONFIG)
    for path in configfiles:
        cfg = merge(cfg, load_yaml(path))
    return load_stage_config({k: cfg[k] for k in ("data", "pretrain")}, ["data", "pretrain"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", nargs="*", default=[], help="YAML files over the workflow's config (presets)")
    ap.add_argument("--data", default="results/data/ffcv", help="folder with train.beton (run the workflow first)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's)")
    args = ap.parse_args(argv)
    data = Path(args.data)
    if not (data / "train.beton").is_file():
        raise SystemExit(
            f"[bench] {data / 'train.beton'} not found: convert the dataset first (snakemake {data / 'train.beton'})"
        )
    from pipeline.pretrain import Job, Trainer  # after the argument check: imports torch models, FFCV

    cfg = base_cell_config(args.configfile)
    if args.threads:
        cfg["pretrain"]["threads"] = args.threads  # the Trainer applies it (pipeline.runtime.cpus)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as state:
        trainer = Trainer(Job.of(cfg), data, Path(state), distributed.init(), progress=False)
        loaded = [tuple(t.clone() for t in batch) for batch in trainer.loader.batches(0)]
        augmented = [(*trainer.augment(v1, v2), labels, index) for v1, v2, labels, index in loaded]

        def real_epoch():
            trainer.step_in_epoch = 0
            trainer.run_epoch(0)

        candidates = {
            "model": lambda: [trainer.optimize(*batch) for batch in augmented],
            "loader": lambda: [None for _ in trainer.loader.batches(0)],
            "recipe": lambda: [trainer.augment(v1, v2) for v1, v2, _, _ in loaded],
            "real": real_epoch,
        }
        res = interleaved(candidates, rounds=args.rounds)
    model = res["model"]["median_s"]
    ratios = {name: round(r["median_s"] / model, 3) for name, r in res.items()}
    p = cfg["pretrain"]
    result = {
        "steps_per_epoch": len(loaded),
        "batch_size": p["batch_size"],
        "backbone": p["backbone"],
        "width": p.get("width"),
        "crop_size": cfg["data"].get("crop_size"),
        "method": p["method"],
        "variant": p.get("variant"),
        "threads": torch.get_num_threads(),
        "loader_workers": cfg["data"].get("workers"),
        "results": res,
        "ratio_vs_model": ratios,
        "target_real_vs_model": TARGET,
    }
    path = write("epoch", result)
    c = cpu()
    print(
        f"{p['method']} {p.get('variant')} {p['backbone']} width {p.get('width')}, batch {p['batch_size']}, "
        f"{len(loaded)} steps, {torch.get_num_threads()} torch threads; {c['model']} "
        f"({'AVX-512' if c['avx512'] else 'no AVX-512'}):"
    )
    for name, r in res.items():
        print(f"  {name:<7} {r['median_s']:.3f} s/epoch  x{ratios[name]:.3f} of model")
    verdict = "within" if ratios["real"] <= TARGET else "ABOVE"
    print(f"real / model = {ratios['real']:.3f} ({verdict} the {TARGET} target)  ({path})")
    return result


if __name__ == "__main__":
    main()
