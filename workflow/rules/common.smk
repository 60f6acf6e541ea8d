# Shared helpers of the rules: paths, the interpreter, per-stage config payloads.
import dataclasses
import json
import os
import shlex
import sys

# only pipeline.dag modules: building the DAG imports no torch
from pipeline.dag.claims_plan import not_trained
from pipeline.dag.config import check_dataset, check_detect_root, detect_protocol, result_config, result_part
from pipeline.dag.grid import BASE_ID, cell_params, cell_resources as grid_cell_resources, detects as cell_detects
from pipeline.dag.grid import claims_budget
from pipeline.dag.sections import SYNTHETIC_PARTS
from pipeline.base.keys import JOBS, RUNTIME
from pipeline.base.layout import (
    CELL_ID,
    CLAIMS_TABLES,
    cell_file,
    TABLE_FORMATS,
    figure_files,
    folder_state,
    stage_config,
    table_files,
    trial_log,
)

from pipeline.dag.sweeps import drawn, fine_tuned, swept

R = CFG.results
# the studies the grid sweeps: their tables and figures are the tables stage's outputs
SWEPT = swept(CELLS, fine_tuned(CFG.detect, CELLS))
DRAWN = drawn(SWEPT)

PY = shlex.quote(sys.executable)  # the interpreter running snakemake (.venv), also on SLURM nodes
CONDA_ENV = "../envs/moco.yaml"


def job_config(sections_of, drop=(RUNTIME,)):
    """A rule's config params, from ``sections_of(wildcards)`` (section name -> the dict the
    config states, from ``config``: the job's JSON holds the keys given, no more): ``key``,
    the sections' result keys (pipeline.dag.config.result_config), which Snakemake compares to
    decide a rerun; ``cfg``, the whole sections, which the job reads. ``cfg`` is a function of
    ``threads`` because Snakemake does not compare such params (they are "derived"): a change
    of threads, workers or monitor frequency reruns nothing."""
    return {
        "key": lambda w: stage_config(**result_config(sections_of(w), drop)),
        "cfg": lambda w, threads: stage_config(**sections_of(w)),
    }


def params_of(cell):
    """The cell (pipeline.dag.grid.Cell): its typed pretrain section and its override (a claims
    cell's too: its runtime keys, e.g. the ViT stability cells' kNN monitor every epoch, are in
    no id)."""
    if cell in CELLS:
        return CELLS[cell]
    return CLAIMS_CELLS[cell] if cell in CLAIMS_CELLS else cell_params(CFG, cell)


def cell_pretrain(cell):
    """The cell's pretrain section as the config states it: what its jobs' JSON holds."""
    return params_of(cell).stated(config["pretrain"])


def cell_probe(cell):
    """The probe section of the cell's job: its seed offset by the cell's pretraining seed, so
    that a cell's seeds differ in the probe's draws too (cells paired by seed share them)."""
    return {**config["probe"], "seed": CFG.probe.seed + params_of(cell).pretrain.seed}


def detects(cell):
    """Detection transfer for this cell? (pipeline.dag.grid.detects)"""
    return cell_detects(CFG.detect, cell, params_of(cell).pretrain)


def detect_params(protocol):
    """A fine-tuning trial's params; ``protocol(wildcards)``: its detect.protocols name, None for
    the main protocol. How many trials and which cells do not change a trial (raising trials adds
    jobs only); the resume state is a function of resources: Snakemake does not compare it."""
    folder = lambda w: "detect" if protocol(w) is None else f"detect-{protocol(w)}"
    return {
        **job_config(lambda w: {"detect": trial_detect(protocol(w))}),
        "py": PY,
        "root": detection_root(),
        "seed": lambda w: CFG.detect.seed + int(w.trial),
        "launch": python_module(CFG.detect.ranks),  # several ranks: DDP, SyncBN with norm bn
        "state": lambda w, resources: f"{R}/state/{w.cell}/{folder(w)}/trial{w.trial}",
    }


def cell_launch(cell):
    """How a cell's ranks start: the config's launcher; the random-init baseline, which trains
    nothing (its registry entry), always as one direct process (never srun over GPU nodes or a submitit job)."""
    trains = params_of(cell).pretrain.trains
    return CFG.launch if trains else dataclasses.replace(CFG.launch, launcher="direct")


def cell_outputs(cell):
    outs = [cell_file(R, cell, "probe")]
    if detects(cell):
        outs.append(cell_file(R, cell, "detect"))
        outs += [cell_file(R, cell, "protocol").format(protocol=name) for name in CFG.detect.protocols]
    return outs


def trial_detect(protocol=None):
    """The detect section a fine-tuning trial runs with (its result keys: the cells, trials and
    protocols add jobs, and change none): the main protocol's, or ``protocol``'s over it."""
    detect = config["detect"] if protocol is None else detect_protocol(config["detect"], protocol)
    return result_part("detect", detect, drop=(JOBS,))


LOADER = CFG.data.loader
CONVERTED = f"{R}/data/ffcv"  # the .beton files and their JSON reports


def converted(split):
    """What a stage reads of a converted split: the .beton and its report, or with
    data.loader: torchvision only the report (it names the source images; FFCV need not be
    installed, and no .beton is written)."""
    summary = f"{CONVERTED}/{split}.json"  # (`report` would be read as Snakemake's keyword)
    return [f"{CONVERTED}/{split}.beton", summary] if LOADER == "ffcv" else [summary]


def split_root(wildcards):
    """What pipeline.convert --root reads for a split: the split's folder for the file layouts
    (synthetic, imagefolder, unlabeled), torchvision's root for cifar10/cifar100/stl10."""
    source, root = CFG.dataset.source, CFG.dataset.root
    if source == "synthetic":
        return f"{R}/data/synthetic/cls/{wildcards.split}"
    if source in ("imagefolder", "unlabeled"):
        return f"{root}/{wildcards.split}"
    return root


def dataset_folder(wildcards):
    """convert's input: the embedded set's folder; another source's folder is read by the job,
    and is checked here, when a conversion is in the DAG, not when the Snakefile is read: a
    `snakemake plan` needs no data."""
    if CFG.dataset.source == "synthetic":
        return [f"{R}/data/synthetic/cls"]
    check_dataset(CFG.dataset)  # dataset.root: folder not found: ...
    return []


def detection_folder(wildcards):
    """detect's input: the embedded scenes, or none (detect.root, checked as dataset_folder)."""
    if not CFG.detect.root:
        return [f"{R}/data/synthetic/det"]
    check_detect_root(CFG.detect)
    return []


def detection_root():
    """COCO-format folder of the detection transfer: the user's, or the embedded scenes."""
    return CFG.detect.root or f"{R}/data/synthetic/det"


def cell_resources(cell):
    """Job size of one cell's pretraining, scaled with its epochs, backbone and batch
    (grid.resources; pipeline.dag.grid.cell_resources): {"runtime": minutes, "nodes": n}."""
    return grid_cell_resources(params_of(cell).pretrain, CFG.grid.resources)


def cell_runtime(wildcards):
    """resources: runtime=cell_runtime (minutes), for rules with a {cell} wildcard."""
    return cell_resources(wildcards.cell)["runtime"]


def cell_nodes(wildcards):
    """resources: nodes=cell_nodes, for rules with a {cell} wildcard."""
    return cell_resources(wildcards.cell)["nodes"]


def cell_world(wildcards):
    """Ranks of a cell's pretraining (nodes x ranks per node), which set its per-rank batch, BN
    groups and crops: submitit's launch.slurm geometry; under a profile whose pretrain rule runs
    srun (resource ``mpi``), its nodes (set-resources, else grid.resources) x tasks_per_node (or
    its ``tasks``); else one process. The random-init baseline trains nothing: 1."""
    launch = cell_launch(wildcards.cell)
    if not params_of(wildcards.cell).pretrain.trains:
        return 1
    if launch.launcher == "submitit":
        return launch.slurm.nodes * launch.slurm.tasks_per_node
    res = profile_resources().get("pretrain", {})
    if not res.get("mpi"):
        return 1
    nodes = int(res.get("nodes") or cell_nodes(wildcards))
    return nodes * int(res["tasks_per_node"]) if res.get("tasks_per_node") else int(res.get("tasks") or nodes)


def profile_resources():
    """The profile's set-resources as given, keyed by each rule's name: {resource: its raw value, e.g. "gpu:1"}."""
    given = workflow.resource_settings.overwrite_resources or {}
    return {rule: {k: getattr(v, "raw", v) for k, v in res.items()} for rule, res in given.items()}


def tables_sections(wildcards=None):
    """What the tables state and which cells they expect (grid.resources does not matter)."""
    grid = {k: v for k, v in config["grid"].items() if k != "resources"}
    return dict(
        dataset=config["dataset"],
        pretrain=config["pretrain"],
        grid=grid,
        probe=config["probe"],
        detect=config["detect"],
    )


def claims_inputs(wildcards):
    """What `snakemake claims` needs: each claims cell's probe (its pretraining with it)."""
    if CLAIMS_ERROR is not None:
        raise CLAIMS_ERROR
    for key, why in not_trained(CFG.claims, claims_budget(CFG)).items():  # said before any job starts
        print(f"claims: not trained, this budget cannot decide {key} ({why})", file=sys.stderr)
    return [cell_file(R, cell, "probe") for cell in CLAIMS_CELLS]


def claims_sections(wildcards=None):
    """What the claims tables state and which cells they read."""
    sections = {k: v for k, v in tables_sections().items() if k != "detect"}
    return {**sections, "claims": config["claims"]}


def for_report(path, caption, **marks):
    """``path`` marked for the HTML report: Snakemake's report() (in a .smk file a line may not
    start with it, the parser would read the ``report:`` keyword)."""
    return report(path, caption=f"../report/{caption}.rst", **marks)


def reported_tables(names=SWEPT, category="Tables"):
    """The tables in the report; the claims come first (the report lists categories A-Z)."""
    return [
        for_report(
            path, study, category=category, subcategory=study, labels={"study": study, "format": TABLE_FORMATS[ext]}
        )
        for (study, ext), path in table_files(R, names).items()
    ]


def reported_figures():
    """The PNGs in the report (figures/<name>.png, figures/curves/<cell>.png); PDFs alongside."""
    figures = [
        for_report(f"{R}/figures/{name}.png", name, category="Figures", labels={"figure": name}) for name in DRAWN
    ]
    curves = [
        for_report(f"{R}/figures/curves/{cell}.png", "curves", category="Training curves", labels={"cell": cell})
        for cell in CELLS
    ]
    return figures + curves


wildcard_constraints:
    cell=CELL_ID,
    protocol=r"[A-Za-z0-9_]+",
    split=r"train|val",
    trial=r"\d+",


def python_module(ranks):
    """How a stage's module starts: one process, or torchrun's one per GPU of the job (DDP)."""
    if ranks == 1:
        return "-m"
    return f"-m torch.distributed.run --standalone --nproc-per-node {ranks} -m"
