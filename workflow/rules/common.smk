# Shared helpers of the rules: paths, the interpreter, per-stage config payloads.
import json
import os
import shlex
import sys

from pipeline.grid import cell_params

R = config["results"]
PY = shlex.quote(sys.executable)  # the interpreter running snakemake (.venv), also on SLURM nodes
CONDA_ENV = "../envs/moco.yaml"


def stage_config(**sections):
    """The JSON a stage receives: only its own sections, so that unrelated edits of the
    config do not invalidate its outputs (Snakemake reruns a job whose params changed)."""
    return json.dumps(sections, sort_keys=True, separators=(",", ":"))


def params_of(cell):
    return CELLS[cell] if cell in CELLS else cell_params(config, cell)


def detects(cell):
    """Detection transfer for this cell? ResNet backbones only, and only the chosen cells."""
    det = config["detect"]
    chosen = det.get("cells", ["all"])
    return (det["enabled"] and params_of(cell)["backbone"].startswith("resnet")
            and ("all" in chosen or cell in chosen))


def cell_outputs(cell):
    outs = [f"{R}/cells/{cell}/probe.json"]
    if detects(cell):
        outs.append(f"{R}/cells/{cell}/detect.json")
    return outs


def split_root(wildcards):
    """The ImageFolder split a .beton is converted from."""
    if config["dataset"]["source"] == "synthetic":
        return f"{R}/data/synthetic/cls/{wildcards.split}"
    return f"{config['dataset']['root']}/{wildcards.split}"


def detection_root():
    """COCO-format folder of the detection transfer: the user's, or the embedded scenes."""
    return config["detect"]["root"] or f"{R}/data/synthetic/det"


wildcard_constraints:
    cell=r"base|[A-Za-z_]+=[A-Za-z0-9_.+-]+(,[A-Za-z_]+=[A-Za-z0-9_.+-]+)*",
    split=r"train|val",
