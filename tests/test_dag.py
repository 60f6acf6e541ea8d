"""Building the DAG: without torch, with command-line overrides read as docs/configuration.md
documents them, one registry per list, and `snakemake --profile slurm` typed as is."""

import re
import subprocess
import sys

import pytest
from conftest import REPO, run, snakemake_cli
from test_workflow import jobs_planned, pretraining_jobs


def dry_run(tmp_path, *args, check=True, target=()):
    return run(
        [*snakemake_cli(), *target, "-n", "-p", "--config", f"results={tmp_path / 'r'}", *args],
        timeout=120,
        check=check,
    )


def test_building_the_dag_imports_no_torch(tmp_path):
    code = (
        "import sys\nfrom snakemake.cli import main\n"
        f"try:\n    main(['-n', '--quiet', 'rules', '--config', 'results={tmp_path / 'r'}'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'torchvision', 'matplotlib', 'pipeline.report.studies', "
        "'pipeline.nets.models') if m in sys.modules))"
    )  # (pandas comes with the SLURM plugin itself)
    out = run([sys.executable, "-c", code], timeout=120).stdout
    assert "HEAVY []" in out, out[-2000:]


def test_the_snakefile_leaves_snakemakes_expand_alone():
    code = "\n".join(line.split("#")[0] for line in (REPO / "Snakefile").read_text().splitlines())
    assert not re.search(r"\bexpand\b", code)  # neither imported nor assigned over Snakemake's


# --- the overrides of docs/configuration.md, run as it shows them ------------------------------
@pytest.mark.integration
def test_nested_override_is_read_as_a_number_and_merged_key_by_key(tmp_path):
    out = dry_run(tmp_path, "pretrain={epochs: 50}").stdout
    assert '"epochs":50' in out and '"epochs":"50"' not in out
    assert '"method":"moco","min_steps":520,"schedule":"cosine"' in out  # the rest of the section is still there
    assert pretraining_jobs(jobs_planned(out)) == 9  # the demo's 3 cells x 3 seeds


@pytest.mark.integration
def test_override_reports_the_real_problem(tmp_path):
    proc = dry_run(tmp_path, "grid={one_at_a_time: {K: [1000]}}", check=False)
    assert proc.returncode != 0
    assert "K=1000 is not a multiple of the global batch size" in proc.stdout + proc.stderr
    assert "is not of type" not in proc.stdout + proc.stderr


@pytest.mark.integration
def test_only_the_chosen_cells_run(tmp_path):
    out = dry_run(tmp_path, "grid={only: [base, method=random, method=supervised]}").stdout
    assert pretraining_jobs(jobs_planned(out)) == 3 * 3  # config.yaml's grid.seeds: 3 of each
    assert "cells/K=1024/" not in out and "cells/method=random/" in out
    proc = dry_run(tmp_path, "grid={only: [K=999]}", check=False)
    assert "grid.only: ['K=999'] not in the grid" in proc.stdout + proc.stderr


def test_command_line_values_are_read_against_the_schema():
    from pipeline.dag.config import read_command_line_values

    cfg = {
        "pretrain": {"epochs": "50", "m": "0.9", "backbone": "resnet18", "shuffle_bn": "false"},
        "dataset": {"root": "null", "source": "synthetic"},
        "detect": {"cells": ["base"], "lr_steps": ["10"]},
        "grid": {"one_at_a_time": {"K": ["1024"], "aug": ["v1"]}},
        "results": "1234",
    }
    read_command_line_values(cfg)
    assert cfg["pretrain"] == {"epochs": 50, "m": 0.9, "backbone": "resnet18", "shuffle_bn": False}
    assert cfg["dataset"]["root"] is None and cfg["detect"] == {"cells": ["base"], "lr_steps": [10]}
    assert cfg["grid"]["one_at_a_time"] == {"K": [1024], "aug": ["v1"]} and cfg["results"] == "1234"


# --- one registry per list ----------------------------------------------------------------------
def test_backbone_names_have_one_source():
    from pipeline.base import layout
    from pipeline.dag import grid
    from pipeline.dag.config import load_schema
    from pipeline.nets import resnet

    names = [*layout.RESNETS, *layout.VITS]
    assert list(layout.BACKBONE_LABELS) == names
    assert list(resnet.ARCHS) == list(layout.RESNETS)  # the ViTs' sizes: layout.VITS itself
    schema = load_schema()
    assert schema["properties"]["pretrain"]["properties"]["backbone"]["enum"] == names
    cost = schema["properties"]["grid"]["properties"]["resources"]["properties"]["backbone_cost"]
    assert cost["propertyNames"]["enum"] == names and list(grid.BACKBONE_COST) == names


# --- `snakemake --profile slurm`, typed from the repository -----------------------------------
def link_profiles(config_home, check=True):
    return subprocess.run(
        ["bash", str(REPO / ".ci" / "link-profiles.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(config_home)},
        check=check,
    )


@pytest.mark.integration
def test_profile_slurm_by_name_from_the_repository(tmp_path):
    home = tmp_path / "config"
    out = link_profiles(home)
    assert "snakemake --profile slurm" in out.stdout
    assert (home / "snakemake" / "slurm").resolve() == REPO / "profiles" / "slurm"
    link_profiles(home)  # again: nothing to do, no complaint
    proc = run(
        [*snakemake_cli(), "--profile", "slurm", "-n", "--config", f"results={tmp_path / 'r'}"],
        timeout=120,
        env={"XDG_CONFIG_HOME": str(home)},
    )
    assert "slurm_partition=gpu" in proc.stdout and "gres=gpu:4" in proc.stdout  # the executor's resources
    by_path = run(
        [*snakemake_cli(), "--profile", "profiles/slurm", "-n", "--config", f"results={tmp_path / 'r'}"], timeout=120
    )
    assert "gres=gpu:4" in by_path.stdout  # the path form still works


def test_a_different_existing_profile_is_left_alone(tmp_path):
    mine = tmp_path / "config" / "snakemake" / "slurm"
    mine.mkdir(parents=True)
    (mine / "config.yaml").write_text("executor: slurm\njobs: 3\n")
    out = link_profiles(tmp_path / "config")
    assert "left as it is" in out.stdout + out.stderr and "--profile profiles/slurm" in out.stdout + out.stderr
    assert (mine / "config.yaml").read_text() == "executor: slurm\njobs: 3\n" and not mine.is_symlink()


# --- `snakemake claims`: its own cells, the default target unchanged ---------------------------
@pytest.mark.integration
def test_claims_target_runs_just_its_cells_and_the_default_target_keeps_its_cost(tmp_path):
    from pipeline.dag.claims_plan import not_trained
    from pipeline.dag.config import DEFAULT_CONFIG, load_config, load_yaml
    from pipeline.dag.grid import claims_budget, claims_cells, group_id

    default = jobs_planned(dry_run(tmp_path).stdout)
    assert default["probe"] == 9 and "claims" not in default  # the demo's base, random init, supervised: 3 seeds
    proc = dry_run(tmp_path, target=["claims"])
    claims = jobs_planned(proc.stdout)
    typed = load_config(load_yaml(DEFAULT_CONFIG))
    cells = claims_cells(typed)
    randoms = sum(group_id(c) == "method=random" for c in cells)
    # pretraining and probe of each claims cell (the base cell among them), no detection transfer;
    # random init's seeds are written by their own rule (no training)
    assert claims == {
        "synthetic": 1,
        "convert": 2,
        "pretrain": len(cells) - randoms,
        "pretrain_random_init": randoms,
        "probe": len(cells),
        "claims": 1,
    }
    # every cell at claims.seeds; the reference and random init also at the pilot seeds; random
    # replacement (only the FIFO bound needs it) at claims.invariant_seeds; the claims this
    # budget cannot decide train nothing, and the DAG says which before any job
    c = typed.claims
    assert c is not None
    seeds = {g: sum(group_id(x) == g for x in cells) for g in map(group_id, cells)}
    assert {n for g, n in seeds.items() if "queue_policy=random" in g} == {c.invariant_seeds}
    assert set(seeds.values()) == {c.invariant_seeds, c.seeds, c.seeds + c.pilot_seeds}
    skipped = not_trained(typed.claims, claims_budget(typed))
    assert all(f"claims: not trained, this budget cannot decide {k}" in proc.stderr for k in skipped)
    # the ViT stability cells' kNN monitor every epoch (a runtime key, in no cell id) reaches their jobs
    vit = [ln for ln in proc.stdout.splitlines() if "pipeline.pretrain" in ln and '"freeze_patch_embed":' in ln]
    assert len(vit) == 4 * c.seeds and all('"knn_every":1' in ln for ln in vit)


@pytest.mark.integration
def test_a_config_whose_claims_cannot_run_fails_that_target_alone(tmp_path):
    tiny = str(REPO / "workflow" / "config" / "presets" / "tiny.yaml")  # 160 images: no 256-key bank
    assert jobs_planned(dry_run(tmp_path, "--configfile", tiny).stdout)["tables"] == 1
    proc = dry_run(tmp_path, "--configfile", tiny, check=False, target=["claims"])
    assert (
        proc.returncode != 0 and "memory bank K=256 negatives need a larger training set" in proc.stdout + proc.stderr
    )


def test_queue_policies_have_one_source():
    from pipeline.base.layout import QUEUE_POLICIES
    from pipeline.dag.config import load_schema
    from pipeline.methods.moco.queue import KeyQueue

    assert load_schema()["properties"]["pretrain"]["properties"]["queue_policy"]["enum"] == list(QUEUE_POLICIES)
    for policy in QUEUE_POLICIES:  # every listed policy is one the queue implements
        KeyQueue(4, 2, policy)
    with pytest.raises(ValueError, match="queue policy must be one of"):
        KeyQueue(4, 2, "lifo")


def test_grid_axes_and_the_cell_id_pattern_have_one_source():
    from pipeline.base.layout import CELL_ID
    from pipeline.dag.config import load_schema
    from pipeline.dag.grid import AXES

    schema = load_schema()["properties"]
    for sweep in ("one_at_a_time", "product"):  # in the order cell ids list them
        assert schema["grid"]["properties"][sweep]["propertyNames"]["enum"] == list(AXES)
    assert set(AXES) <= set(schema["pretrain"]["properties"])  # every axis is a pretrain key
    # the cell wildcard of the rules, `--config cell=...` and grid.only's items: one pattern
    assert "cell=CELL_ID," in (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert schema["cell"]["pattern"] == schema["grid"]["properties"]["only"]["items"]["pattern"] == f"^{CELL_ID}$"


def test_the_readme_layout_lists_every_module():
    """Each module under its own folder in the README's tree (bench's by name)."""
    readme = (REPO / "README.md").read_text()
    layout = readme[readme.index("## Layout") : readme.index("## Extending")]
    listed, folders, missing = set(), {}, []  # folders: indent -> the folder opened at it
    for line in layout.splitlines():
        if not line.startswith("  ") or not line.strip():
            continue
        indent, entry = len(line) - len(line.lstrip()), line.split()[0]
        parents = [folders[i] for i in sorted(folders) if i < indent]
        path = "/".join([*parents, entry.rstrip("/")])
        folders = {i: f for i, f in folders.items() if i < indent}
        if entry.endswith("/"):
            folders[indent] = entry.rstrip("/")
        listed.add(path)
    for path in (REPO / "pipeline").rglob("*.py"):
        rel = path.relative_to(REPO / "pipeline")
        if path.stem == "__init__" or rel.parts[0] == "bench":
            continue
        if rel.as_posix() not in listed:
            missing.append(str(rel))
    bench = [p.stem for p in (REPO / "pipeline" / "bench").glob("*.py") if not p.stem.startswith("__")]
    missing += [f"bench/{b}.py" for b in bench if b not in layout]
    assert not missing, f"README's layout lacks {missing}"


def test_every_stage_has_the_same_entry_points():
    """`python -m pipeline.<stage>` runs main(argv), which parses and calls run(...)."""
    import importlib

    for stage in ("synthetic", "convert", "pretrain", "probe", "detect", "tables", "claims", "export"):
        module = importlib.import_module(f"pipeline.{stage}")
        assert callable(module.run) and callable(module.main), stage


def test_each_seed_of_a_cell_probes_with_its_own_seed(tmp_path):
    """The probe's draws follow the cell's pretraining seed (probe.seed + pretrain.seed): seed=2's
    probe runs at seed 2, the base cell's at 0, and a moved probe.seed moves both."""

    def probe_seeds(*args):
        out = dry_run(tmp_path, "grid={only: [base], seeds: 3}", *args).stdout
        found = {}
        for line in out.splitlines():
            cell = re.search(r"--out \S*cells/([^/]+)/probe\.json", line)
            if "pipeline.probe" in line and cell:
                found[cell.group(1)] = int(re.search(r'"seed":(\d+)', line).group(1))
        return found

    assert probe_seeds() == {"base": 0, "seed=1": 1, "seed=2": 2}
    assert probe_seeds("probe={seed: 10}") == {"base": 10, "seed=1": 11, "seed=2": 12}


def test_a_detection_protocol_fine_tunes_the_same_cells_beside_the_main_one(tmp_path):
    """detect.protocols {bn_all: {norm: bn}}: a second trial per cell and trial, from the same
    checkpoint and seed, whose job states norm bn (the rest the main protocol's), writing
    detect-bn_all/; the main trials' jobs are the same as without it (nothing reruns)."""

    def detect_jobs(*args):
        out = dry_run(tmp_path, "grid={only: [base, method=supervised], seeds: 1}", *args).stdout
        return [line for line in out.splitlines() if "pipeline.detect" in line]

    plain = detect_jobs()
    both = detect_jobs("detect={protocols: {bn_all: {norm: bn}}}")
    main = [j for j in both if "/detect/trial0.json" in j]
    extra = [j for j in both if "/detect-bn_all/trial0.json" in j]
    assert sorted(main) == sorted(plain) and len(plain) == 2 and len(extra) == 2
    for job in extra:
        assert '"norm":"bn"' in job and "--seed 0" in job and "/pretrain/checkpoint.pt" in job
    proc = dry_run(tmp_path, "detect={protocols: {more: {trials: 3}}}", check=False)
    assert "detect.protocols.more: trials cannot differ between protocols" in proc.stdout + proc.stderr
