"""A stage's start-up: the seconds a fresh process spends importing it, beside ``import torch``
alone, each in its own interpreter, interleaved round after round; the medians and their ratio.

    python -m pipeline.bench startup [--rounds 7] [--modules pipeline.pretrain pipeline.probe]
                                     [--first-step]

Every pretraining, probe and detection job pays its stage's import once, and so does every test
that starts a stage as a process. A stage should import torch and what it uses, nothing more:
the report also says which heavy packages each import pulled in (torchvision imports
torch._dynamo through its ops.roi_align, about 2 s on a 2-core CPU). ``--first-step`` adds, for
each module, its import plus an optimizer's first step, zero_grad and state dict, once with the
stages' SGD and once with torch.optim.SGD, whose compile wrappers import torch._dynamo there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from pipeline.bench.timing import cpu, write

BASELINE = "torch"
STAGES = ("pipeline.pretrain", "pipeline.probe", "pipeline.detect")
HEAVY = ("torchvision", "torch._dynamo", "timm", "pycocotools", "matplotlib")  # reported when imported

# a fresh interpreter: its import's wall time (perf_counter around the import statement and what
# follows it) and which of HEAVY it left in sys.modules
PROBE = """
import json, sys, time
t0 = time.perf_counter()
import {module}
{then}
seconds = time.perf_counter() - t0
print(json.dumps({{"s": seconds, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""
# "<module>+<optimizer>": the import, then that optimizer's first step as a stage takes it
FIRST_STEP = {"sgd": "pipeline.nets.optim.SGD", "torch-sgd": "torch.optim.SGD"}
STEP = """
import pipeline.nets.optim, torch
w = torch.nn.Parameter(torch.ones(8, 8))
opt = {optimizer}([w], lr=0.1, momentum=0.9)
w.grad = torch.ones(8, 8)
opt.step()
opt.zero_grad()
opt.load_state_dict(opt.state_dict())
"""


def import_once(entry: str) -> dict:
    module, _, optimizer = entry.partition("+")
    then = STEP.format(optimizer=FIRST_STEP[optimizer]) if optimizer else ""
    code = PROBE.format(module=module, then=then, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(modules: list[str], rounds: int) -> dict:
    """Per module: median seconds, each round's, the heavy packages it imported, and the ratio of
    its median to ``import torch``'s."""
    names = [BASELINE, *modules]
    for name in names:  # warm-up: the page cache and .pyc files, as a job after the first sees them
        import_once(name)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            runs[name].append(import_once(name))
    out = {}
    base = statistics.median(r["s"] for r in runs[BASELINE])
    for name in names:
        median = statistics.median(r["s"] for r in runs[name])
        out[name] = {
            "median_s": round(median, 4),
            "times_s": [round(r["s"], 4) for r in runs[name]],
            "ratio_to_torch": round(median / base, 3),
            "imports": runs[name][-1]["heavy"],
        }
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--modules", nargs="+", default=list(STAGES))
    ap.add_argument("--first-step", action="store_true", help="also each import plus a first step of each optimizer")
    args = ap.parse_args(argv)
    steps = [f"{m}+{opt}" for m in args.modules for opt in FIRST_STEP] if args.first_step else []
    result = {"rounds": args.rounds, "imports": measure([*args.modules, *steps], args.rounds)}
    info = cpu()
    where = f"{info['model']} ({', '.join(info['vector_flags'])})"
    print(f"import time, medians of {args.rounds} interleaved rounds, {where}:")
    for name, row in result["imports"].items():
        heavy = f"  imports {', '.join(row['imports'])}" if row["imports"] else ""
        print(f"  {name:<30} {row['median_s']:.3f} s  {row['ratio_to_torch']:.2f}x import torch{heavy}")
    print(f"({write('startup', result)})")
    return result


if __name__ == "__main__":
    main()
