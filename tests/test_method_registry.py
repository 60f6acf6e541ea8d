"""A new method is its own file plus one registry entry: a toy method, defined and registered
here and nowhere else, goes through the config's validation, the grid, a real pretraining and
probe on the embedded data, the tables and the figures."""

import csv
import dataclasses
import importlib

import pytest
import torch
from torch.nn import functional as F

from pipeline import REPO, pretrain, probe, tables
from pipeline.base.layout import cell_file
from pipeline.dag.config import ConfigError, load_config, load_schema, pretrain_cell, section
from pipeline.dag.grid import grid_cells
from pipeline.methods import METHODS, MethodSpec, method_spec, register
from pipeline.methods.section import Pretrain
from pipeline.nets.method import Encoder, Method, Step
from pipeline.nets.models import feature_dim


class Toy(Method):
    """In-batch instance discrimination through one encoder: each image's first view against
    the second views of the batch (no key encoder, no queue)."""

    def __init__(self, backbone: torch.nn.Module, dim: int, T: float):
        super().__init__()
        self.encoder_q = Encoder(backbone, torch.nn.Linear(feature_dim(backbone), dim))
        self.T = T

    def forward(self, x1, x2=None, index=None, labels=None):
        q1, q2 = (F.normalize(self.encoder_q(x), dim=1) for x in (x1, x2))
        logits = q1 @ q2.T / self.T
        target = torch.arange(len(q1), device=logits.device)
        # a metric of its own: the loop logs what a method reports, under its name
        return Step(F.cross_entropy(logits, target), {"toy_top1": 100.0 * (logits.argmax(1) == target).double().mean()})


def build_toy(p, backbone, num_classes, num_samples, world_size):
    return Toy(backbone, p.dim, p.T)


# between MoCo's rows (10) and the supervised baseline's (20)
TOY = MethodSpec("toy", "toy method", 15, build_toy)


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    del METHODS[TOY.name]


BASE = {
    "method": "moco",
    "variant": "v2",
    "backbone": "resnet18",
    "width": 8,
    "dim": 16,
    "K": 32,
    "m": 0.9,
    "T": 0.2,
    "epochs": 3,
    "min_steps": 0,  # 15 steps by design (80 images), not the base's 520
    "batch_size": 16,
    "lr": 0.05,
    "mask_same_source": True,
    "knn_every": 0,
}
DATA = {"crop_size": 32, "workers": 1}


def test_the_schema_takes_the_registered_methods(toy):
    assert load_schema()["properties"]["pretrain"]["properties"]["method"]["enum"] == [
        "moco",
        "simclr",
        "byol",
        "supervised",
        "random",
        "toy",
    ]
    cell = pretrain_cell(Pretrain(), {"method": "toy"})
    assert cell.spec is TOY and not cell.is_moco and not cell.has_queue and cell.trains
    assert cell.optimizer_name == "sgd"  # the registry's default: the MoCo v1/v2 recipe's


def test_an_unregistered_method_is_refused():
    known = r"\['moco', 'simclr', 'byol', 'supervised', 'random'\]"
    with pytest.raises(ConfigError, match=rf"config key 'pretrain.method': 'toy' is not one of {known}"):
        pretrain_cell(Pretrain(), {"method": "toy"})


def test_the_registry_refuses_what_it_cannot_hold(toy):
    with pytest.raises(ValueError, match="method 'toy' is registered already"):
        register(TOY)
    with pytest.raises(
        ValueError, match=r"unknown method 'dino' \(known: moco, simclr, byol, supervised, random, toy\)"
    ):
        method_spec("dino")
    with pytest.raises(ValueError, match="method 'random' trains nothing: it has no model to build"):
        method_spec("random").builder()


def test_the_registry_says_which_cells_have_a_queue():
    """By definition of each mechanism: only MoCo v1/v2's own mechanism keeps a queue."""
    queue = {
        (): True,
        (("variant", "v1"),): True,
        (("variant", "v3"),): False,
        (("mechanism", "end_to_end"),): False,
        (("mechanism", "memory_bank"),): False,
        (("method", "supervised"),): False,
        (("method", "random"),): False,
    }
    for change, expected in queue.items():
        assert Pretrain(**dict(change)).has_queue is expected, change


def read_csv(results, name):
    return list(csv.DictReader((results / "tables" / f"{name}.csv").open()))


@pytest.mark.integration
def test_a_toy_method_runs_through_grid_pretraining_tables_and_figures(toy, ffcv_small, tmp_path):
    cfg = {
        "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 8, "val_per_class": 4}},
        "pretrain": BASE,
        "probe": {"mode": "cached", "epochs": 5},
        "detect": {"enabled": False},
        "grid": {"one_at_a_time": {"method": ["toy"]}, "baselines": ["random"]},
    }
    cells = {cid: cell.stated(BASE) for cid, cell in grid_cells(load_config(cfg)).items()}
    assert list(cells) == ["base", "method=toy", "method=random"]
    assert cells["method=toy"] == {**BASE, "method": "toy"}
    results = tmp_path / "results"
    for cid, params in cells.items():
        out = results / "cells" / cid / "pretrain"
        summary = pretrain.run({"data": DATA, "pretrain": params}, ffcv_small, out, tmp_path / "state" / cid, False)
        assert summary["method"] == params["method"] and summary["failure"] is None, (cid, summary["failure"])
        ckpt = out / "checkpoint.pt"
        probe.run({"probe": cfg["probe"], "data": DATA}, ckpt, ffcv_small, results / "cells" / cid / "probe.json")
    assert torch.load(cell_file(results, "method=toy", "checkpoint"), weights_only=False)["method"] == "toy"
    assert section("pretrain", cells["method=toy"]).spec is TOY

    tables.run(results, cfg)
    rows = read_csv(results, "methods")
    # MoCo's rows, then the toy's (its registry order), then the baselines; its label from the registry
    assert [r["method"] for r in rows] == ["MoCo (base cell)", "toy method", "supervised", "random init"]
    toy_row = rows[1]
    assert toy_row["variant"] == "" and toy_row["backbone"] == "ResNet-18 (width 8)"  # a variant is MoCo's
    assert 0 <= float(toy_row["top1"]) <= 100 and toy_row["top1_n"] == "1"
    # not a MoCo variant: none of the MoCo ablations takes its cell; the grid table lists every cell
    assert [r["cell"] for r in read_csv(results, "grid")] == ["base", "method=random", "method=toy"]
    for curve in ("base", "method=toy", "method=random"):
        assert (results / "figures" / "curves" / f"{curve}.png").read_bytes()[:4] == b"\x89PNG"


# --- where a method's parts live -------------------------------------------------------------------
def pipeline_imports(path):
    """Every pipeline module a file imports, type-checking imports and function-local ones included."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            found |= {node.module} if node.module != "pipeline" else {f"pipeline.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline")}
    return found


SHARED_PARTS = {"momentum_target", "ema_check", "info_nce", "cross_entropy", "heads", "split_bn", "gather"}


def test_the_algorithms_import_nothing_above_them():
    """The methods' algorithms (every method folder's torch modules but its entry and its model
    builder) and the parts they share build on torch, each other and what every method is
    (nets.method), and the floor's lists (pipeline.base.layout): no config, stage, registry or network
    builder, not even for a type hint."""
    methods = REPO / "pipeline" / "methods"
    algorithms = [methods / f"{name}.py" for name in SHARED_PARTS]
    algorithms += [p for p in methods.glob("*/*.py") if p.name not in ("__init__.py", "model.py", "keys.py")]
    algorithms += [methods / name / "model.py" for name in ("simclr", "byol")]  # their algorithms
    allowed = {f"pipeline.methods.{name}" for name in SHARED_PARTS} | {"pipeline.nets.method", "pipeline.base.layout"}
    for path in algorithms:
        own = f"pipeline.methods.{path.parent.name}." if path.parent != methods else "-"
        above = {m for m in pipeline_imports(path) if m not in allowed and not m.startswith(own)}
        assert not above, f"{path.relative_to(REPO)} imports {sorted(above)}"
    assert not (REPO / "pipeline" / "moco").exists()  # MoCo's algorithm lives in its folder


def test_each_method_is_one_folder_holding_its_entry_check_keys_and_model():
    """Each registered method's entry, config check, keys and build are defined in its own folder
    (or module) under pipeline/methods/, beside the parts methods share; nothing else in the
    package names a method's module: the stages reach a model through the entry."""
    methods = REPO / "pipeline" / "methods"
    not_methods = ("__init__", "__pycache__", "registry", "build", "section")
    modules = {p.stem for p in methods.iterdir() if p.stem not in not_methods}
    entries = {}
    for stem in modules - SHARED_PARTS:
        module = importlib.import_module(f"pipeline.methods.{stem}")
        entries[module.ENTRY.name] = module.__name__
        for part in (module.ENTRY.build, module.ENTRY.check, module.ENTRY.recipe):
            assert part is None or part.__module__ == module.__name__, (stem, part)
    for base in Pretrain.__mro__[1:]:  # each method's own keys: its folder's keys.py
        if base.__name__.endswith("Keys"):
            assert base.__module__.startswith("pipeline.methods.") and base.__module__.endswith(".keys"), base
    assert entries == {
        "moco": "pipeline.methods.moco",
        "simclr": "pipeline.methods.simclr",
        "byol": "pipeline.methods.byol",
        "supervised": "pipeline.methods.supervised",
        "random": "pipeline.methods.random_init",
    }
    shared = {"pipeline.methods.build", "pipeline.methods.section"}
    shared |= {f"pipeline.methods.{name}" for name in SHARED_PARTS}
    for path in (REPO / "pipeline").rglob("*.py"):
        if methods in path.parents or "bench" in path.parts:  # benchmarks may name a method's module
            continue
        named = {
            m for m in pipeline_imports(path) if m.split(".")[:2] == ["pipeline", "methods"] and len(m.split(".")) > 2
        }
        assert named <= shared, f"{path.relative_to(REPO)} imports {sorted(named)}"


def test_a_method_owns_its_keys():
    """MoCo's, SimCLR's and BYOL's own keys are declared in their folders and held by Pretrain
    beside the shared ones; the shared section holds none of them."""
    from pipeline.methods.byol.keys import ByolKeys
    from pipeline.methods.moco.keys import MocoKeys
    from pipeline.methods.section import SharedPretrain
    from pipeline.methods.simclr.keys import SimclrKeys

    own = {f.name for cls in (MocoKeys, SimclrKeys, ByolKeys) for f in dataclasses.fields(cls)}
    shared = {f.name for f in dataclasses.fields(SharedPretrain)}
    assert {"K", "queue_policy", "shuffle_bn", "mechanism", "variant"} <= own and {"predictor", "negatives"} <= own
    assert not own & shared and {"m", "T", "dim", "mlp_dim", "batch_size"} <= shared
    assert {f.name for f in dataclasses.fields(Pretrain)} == own | shared
    assert Pretrain().predictor is True and Pretrain(K=1024).K == 1024
