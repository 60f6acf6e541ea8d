"""How long building the DAG takes (`snakemake -n`): on the default config and on a grid of
100 cells, for this working tree and, side by side, for a git revision (``--against``, checked
out into a temporary worktree). Rounds are interleaved, medians compared.

    python -m pipeline.bench dag [--against HEAD~3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline import REPO
from pipeline.bench.timing import interleaved, write

# 5 x 4 x 5 = 100 MoCo cells (K stays a multiple of the default batch)
GRID_100 = {
    "grid": {
        "one_at_a_time": {},
        "product": {
            "K": [256, 512, 1024, 2048, 4096],
            "m": [0.9, 0.99, 0.999, 0.9999],
            "T": [0.07, 0.1, 0.2, 0.5, 1.0],
        },
    }
}


def dry_run(tree: Path, results: Path, extra: list[str]):
    snakemake = Path(sys.executable).parent / "snakemake"

    def run():
        proc = subprocess.run(
            [str(snakemake), "-n", "--quiet", "rules", *extra, "--config", f"results={results}"],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"snakemake -n failed in {tree}:\n{proc.stderr[-2000:]}")

    return run


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev], check=True, capture_output=True
    )
    return where


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default=None, help="a git revision to time beside the working tree")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-dag-"))
    grid = tmp / "grid100.yaml"
    grid.write_text(json.dumps(GRID_100))
    trees = {"this tree": REPO}
    try:
        if args.against:
            trees[args.against] = worktree(args.against, tmp / "against")
        candidates = {}
        for name, tree in trees.items():
            candidates[f"{name}: default"] = dry_run(tree, tmp / "r", [])
            candidates[f"{name}: 100 cells"] = dry_run(tree, tmp / "r", ["--configfile", str(grid)])
        res = interleaved(candidates, rounds=args.rounds)
    finally:
        if args.against:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tmp / "against")], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"rounds": args.rounds, "results": res}
    print(f"snakemake -n, median of {args.rounds} interleaved rounds:")
    for name, r in res.items():
        print(f"  {name:<28} {r['median_s']:.2f} s")
    if args.against:
        result["ratio_this_vs_against"] = {
            what: round(res[f"this tree: {what}"]["median_s"] / res[f"{args.against}: {what}"]["median_s"], 3)
            for what in ("default", "100 cells")
        }
        print(
            "  this tree / "
            + args.against
            + ": "
            + ", ".join(f"{k} {v:.2f}x" for k, v in result["ratio_this_vs_against"].items())
        )
    print(f"({write('dag', result)})")
    return result


if __name__ == "__main__":
    main()
