"""The report side's rarer branches (claims, config, plan, studies, figures, tables, grid,
environment): error paths name what is wrong, and each "nothing to show" branch says so."""

import json

import pandas as pd
import pytest
from test_claims import CLAIMS, COLLAPSED, CONFIG, ROLES, full_results, rows_by_claim, seed_cell, verdicts

from pipeline import claims, environment, plan, tables
from pipeline.claims import NOT_RUN
from pipeline.claims import run as write_claims
from pipeline.dag.config import (
    ConfigError,
    check_detector,
    check_pretrain,
    load_config,
    load_stage_config,
    load_yaml,
    read_command_line_values,
    section,
)
from pipeline.dag.grid import Cell, claims_cells, parse_cell_id
from pipeline.dag.training_set import training_set
from pipeline.report import figures, studies
from pipeline.report.stats import CONTRADICTED, HOLDS, INCONCLUSIVE, Estimate
from tests.test_environment import TINY_LOCK, TINY_LOCK_SHA256


# --- claims ------------------------------------------------------------------------------------
def test_claims_whose_cells_the_config_does_not_name_are_not_run(tmp_path):
    # one m (0.99, the reference's) and one K: no low m, no m = 0, no larger K, no m = 0.9999
    cfg = {**CONFIG, "claims": {**CLAIMS, "m": [0.99], "K": [4096]}}
    write_claims(tmp_path, cfg)  # no cell has run: no trained run for the key-encoder check
    rows = rows_by_claim(tmp_path)
    # the transfer claim is gated on the detection config, not on claims.m / claims.K
    assert {k: r["verdict"] for k, r in rows.items() if k not in ("longer", "memory bank", "transfer")} == {
        "fifo": NOT_RUN,
        "low m": NOT_RUN,
        "m = 0": NOT_RUN,
        "key encoder": NOT_RUN,
        "larger K": NOT_RUN,
        "m = 0.9999": NOT_RUN,
        # the rivals' claims need SimCLR's and BYOL's cells, none of which has run
        "large batch": NOT_RUN,
        "queue vs batch": NOT_RUN,
        "byol learns": NOT_RUN,
        "byol predictor": NOT_RUN,
        "byol ema": NOT_RUN,
    }
    assert rows["low m"]["measured"] == "claims.m needs 0.99 and a value in (0, 0.99)"
    assert rows["m = 0"]["measured"] == "claims.m has no 0"
    assert rows["larger K"]["measured"] == "claims.K has one value"
    assert rows["m = 0.9999"]["measured"] == "claims.m lacks 0.999 or 0.9999"


def test_a_fifo_claim_of_one_seed_is_inconclusive(tmp_path):
    full_results(tmp_path, seeds=(0,))
    write_claims(tmp_path, {**CONFIG, "claims": {**CLAIMS, "K": [4096]}})  # one run of each policy
    row = rows_by_claim(tmp_path)["fifo"]
    assert row["verdict"] == INCONCLUSIVE and "max age FIFO 16 (1 seeds), random 97 (1 seeds)" in row["measured"]


def test_a_policy_whose_runs_logged_no_queue_age_is_not_judged(tmp_path):
    # random replacement's runs ended without a queue age: FIFO's bound alone decides nothing
    full_results(tmp_path, **{"K=4096,random": ([59.5, 49.5, 69.5], None, {"queue_age_max": None})})
    write_claims(tmp_path, {**CONFIG, "claims": {**CLAIMS, "K": [4096]}})
    row = rows_by_claim(tmp_path)["fifo"]
    assert (
        row["verdict"] == INCONCLUSIVE
        and row["measured"] == "K=4096 (K/B=16): max age FIFO 16 (3 seeds), random ? (0 seeds)"
    )


def test_random_replacement_that_never_keeps_an_older_key_contradicts_the_fifo_claim(tmp_path):
    # FIFO's oldest key is exactly K/B (16, 64) steps old, random's never older than K/B: the
    # claimed difference between the two policies is not there
    young = {"queue_age_max": 10, "negative_drift_max": 1.0}
    full_results(
        tmp_path,
        **{"K=4096,random": ([59.5, 49.5, 69.5], None, young), "K=16384,random": ([60.0, 50.0, 70.0], None, young)},
    )
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["fifo"] == CONTRADICTED


def test_a_fifo_bound_held_with_room_while_random_keeps_older_keys_is_inconclusive(tmp_path):
    # FIFO's oldest key 15 < K/B = 16: the bound is not reached, so its tightness is not shown
    ref = ROLES["reference"]
    full_results(tmp_path, reference=(ref[1], None, {**ref[3], "queue_age_max": 15}))
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["fifo"] == INCONCLUSIVE


def test_m0_with_one_seed_has_no_interval_and_is_inconclusive(tmp_path):
    full_results(tmp_path)
    for s in (1, 2):
        for f in (tmp_path / "cells" / seed_cell({"epochs": 15, "m": 0.0}, s)).rglob("*.json"):
            f.unlink()
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == INCONCLUSIVE and row["measured"].startswith("1 of 1 seeds failed")


def test_m0_whose_one_seed_did_not_fail_holds_at_random_inits_level(tmp_path):
    """A seed of m = 0 whose loss stayed below the chance rule, its probe at random init's level
    (the fourth claims run's seed 33): the probe decides it. By hand: 10.5 − 10, 11.2 − 11,
    9.4 − 9: Δ +0.37, std 0.153, half 4.303 x 0.153 / sqrt 3 = 0.38: CI [-0.0, +0.7], below +5."""
    full_results(tmp_path, **{"m=0": ([10.5, 11.2, 9.4], [COLLAPSED, None, COLLAPSED], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == HOLDS and row["measured"].startswith("2 of 3 seeds failed by the loss rule")
    assert (row["smallest detectable Δ"], row["seeds to decide"]) == ("—", "—")


def test_m0_whose_probe_reaches_past_the_margin_says_what_would_decide_it(tmp_path):
    """Probe − random init 1, 5, 3 (11 − 10, 16 − 11, 12 − 9): mean 3, std 2, half 4.303 x 2 /
    sqrt 3 = 4.97: CI [-2.0, +8.0] reaches past +5; one seed did not fail. The CI below +5 at a
    Δ of 3 and this spread needs 7 seeds (tests/test_stats.py)."""
    full_results(tmp_path, **{"m=0": ([11.0, 16.0, 12.0], [COLLAPSED, None, COLLAPSED], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == INCONCLUSIVE and "Δ +3.0 ± 5.0 (n=3)" in row["measured"]
    assert (row["smallest detectable Δ"], row["seeds to decide"]) == (
        "±5.0 at n = 3",
        "7 for the CI below +5 at Δ +3.0, or every seed failing by the loss rule (2 of 3 did)",
    )
    # every seed failing by the loss rule decides it, the CI being not above 0
    full_results(tmp_path, **{"m=0": ([11.0, 16.0, 12.0], COLLAPSED, {})})
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["m = 0"] == HOLDS


def test_m0_learning_past_the_margin(tmp_path):
    """Probe − random init 20, 21, 22 (30 − 10, 32 − 11, 31 − 9): CI [+18.5, +23.5] above +5:
    contradicted when no seed failed; with a failed seed the runs disagree: inconclusive."""
    full_results(tmp_path, **{"m=0": ([30.0, 32.0, 31.0], None, {})})
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["m = 0"] == CONTRADICTED
    full_results(tmp_path, **{"m=0": ([30.0, 32.0, 31.0], [None, COLLAPSED, None], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == INCONCLUSIVE
    assert row["seeds to decide"] == "no seed failing by the loss rule (1 of 3 did)"


def test_slow_momentum_decided_on_enough_steps(tmp_path):
    # 600,000 images / 256 = 2,343 steps per epoch, x 15 = 35,145 >= 34,656 (5 half-lives of 0.9999)
    cfg = {**CONFIG, "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 60000}}}
    full_results(tmp_path)
    write_claims(tmp_path, cfg)
    row = rows_by_claim(tmp_path)["m = 0.9999"]
    # m = 0.9999 − m = 0.999 by seed: 50 − 59, 40 − 49, 60 − 69 = -9 each: below 0 on every seed
    assert row["verdict"] == HOLDS and "Δ -9.0 ± 0.0 (n=3)" in row["measured"]


def test_training_set_of_converted_data_from_its_report(tmp_path):
    cfg = load_config({"dataset": {"source": "cifar10", "root": str(tmp_path)}, "detect": {"enabled": False}})

    def size():
        found = training_set(cfg, tmp_path)
        return found.images, found.classes

    assert size() == (50_000, 10)  # not converted yet: CIFAR-10's known count
    report = tmp_path / "data" / "ffcv" / "train.json"
    report.parent.mkdir(parents=True)
    report.write_text("{not json")
    assert size() == (50_000, 10) and "unreadable" in training_set(cfg, tmp_path).where
    this = {"kind": "cifar10", "root": str(tmp_path)}
    report.write_text(json.dumps({"source": this, "num_samples": 49_000, "classes": [str(i) for i in range(10)]}))
    assert size() == (49_000, 10)  # the count the jobs will see
    report.write_text(json.dumps({"source": this, "num_samples": 7}))
    assert size() == (7, None)  # no classes recorded: unknown, not 0


def test_claims_need_their_sections(tmp_path):
    with pytest.raises(ConfigError, match="pretrain and claims sections"):
        write_claims(tmp_path, {"pretrain": CONFIG["pretrain"]})
    with pytest.raises(ConfigError, match="has no 'claims' section"):
        claims_cells(load_config({"pretrain": CONFIG["pretrain"]}))


@pytest.mark.parametrize("module, prog", [(claims, "claims"), (tables, "tables")])
def test_table_writers_exit_naming_a_missing_config_file(tmp_path, module, prog):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(SystemExit) as exit_:
        module.main([str(tmp_path), "--config", str(missing)])
    assert str(exit_.value) == f"[{prog}] config file not found: {missing}"


# --- config ------------------------------------------------------------------------------------
BASE_MOCO = {"method": "moco", "backbone": "resnet18", "epochs": 10, "batch_size": 256, "K": 4096}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"backbone": "vit_small", "variant": "v2"}, "backbone vit_small needs variant v3"),
        ({"variant": "v3", "mechanism": "memory_bank"}, "mechanism memory_bank applies to v1/v2, not v3"),
    ],
)
def test_pretrain_cross_field_errors(change, message):
    with pytest.raises(ConfigError, match=f"^cell x: {message}"):
        check_pretrain(section("pretrain", {**BASE_MOCO, **change}), where="cell x")


@pytest.mark.parametrize(
    "det, message",
    [
        ({"image_size": 800, "max_image_size": 600}, "detect.max_image_size=600 is below detect.image_size=800"),
        ({"batch_size": 6, "ranks": 4}, "detect.batch_size=6 is not a multiple of detect.ranks=4"),
    ],
)
def test_detector_cross_field_errors(det, message):
    with pytest.raises(ConfigError, match=message):
        check_detector(section("detect", det))


def test_dataset_and_detect_roots_are_checked(tmp_path):
    cfg = load_yaml(plan.DEFAULT_CONFIG)
    # a root for every source but the embedded one
    with pytest.raises(ConfigError, match="dataset.root: required for dataset.source 'cifar10'"):
        load_config({**cfg, "dataset": {"source": "cifar10", "root": None}})
    with pytest.raises(ConfigError, match="dataset.root: required for dataset.source 'stl10'"):
        load_stage_config({"dataset": {"source": "stl10"}}, ["dataset"])  # a stage given the section alone
    cifar = {"source": "cifar10", "root": str(tmp_path)}
    with pytest.raises(ConfigError, match="detect.root: required .* unless dataset.source is 'synthetic'"):
        load_config({**cfg, "dataset": cifar, "detect": {**cfg["detect"], "enabled": True, "root": None}})
    gone = tmp_path / "coco"
    with pytest.raises(ConfigError, match=f"detect.root: folder not found: {gone}"):
        load_config({**cfg, "detect": {**cfg["detect"], "enabled": True, "root": str(gone)}}, folders=True)


def test_a_stage_config_file_keeps_only_its_sections(tmp_path):
    path = tmp_path / "stage.yaml"
    path.write_text("probe: {epochs: 3}\nunrelated: {x: 1}\n")
    assert load_stage_config(str(path), ["probe"])["probe"] == {"epochs": 3}  # `unrelated` dropped
    with pytest.raises(ConfigError, match="config section 'data' is missing"):
        load_stage_config({"probe": {}}, ["data"])


def test_a_command_line_value_that_is_not_yaml_stays_a_string():
    # ":" opens a mapping, "[" an unclosed list: not YAML; the schema then names the key
    cfg = read_command_line_values({"pretrain": {"epochs": "[1"}})
    assert cfg == {"pretrain": {"epochs": "[1"}}


# --- grid / studies ----------------------------------------------------------------------------
def test_a_folder_that_is_no_cell_id(tmp_path):
    with pytest.raises(ConfigError, match="cell 'scratch': expected axis=value pairs"):
        parse_cell_id("scratch")
    assert studies.cell_row(tmp_path, "scratch", {}, None) is None


def test_a_cell_row_without_its_config_takes_the_base_with_its_id(tmp_path):
    row = studies.cell_row(tmp_path, "K=1024", {}, {"K": 4096, "m": 0.99})
    assert row["params"] == {"K": 1024, "m": 0.99} and row["status"] == "missing"
    assert studies.cell_row(tmp_path, "K=1024", {}, None)["params"] == {"K": 1024}


def test_the_probe_settings_come_from_the_first_readable_record(tmp_path):
    # python -m pipeline.tables without --config: a probe.json a later version cannot type (a
    # key it no longer has) is passed over for the next one
    for cell, probe in (("K=64", {"a removed key": 1}), ("K=128", {"mode": "augmented", "epochs": 7})):
        (tmp_path / "cells" / cell).mkdir(parents=True)
        (tmp_path / "cells" / cell / "probe.json").write_text(json.dumps({"top1": 50.0, "config": {"probe": probe}}))
    found = studies.recorded_probe(pd.DataFrame({"cell": ["K=64", "K=128"]}), tmp_path)
    assert found is not None and (found.mode, found.epochs, found.knn_k) == ("augmented", 7, 200)


def test_labels_and_sentences():
    assert studies.backbone_label({"backbone": "vit_small", "patch_size": 4}).endswith("/4")
    below = Estimate(-3.0, 1.0, 3)  # mean -3 ± 1: the CI [-4, -2] lies below 0
    sentence = studies.direction_sentence("MoCo", "random init", studies.Delta(below, 3, 0), "top-1")
    assert sentence.endswith("MoCo is below random init on this data (95 % CI [-4.0, -2.0] excludes 0).")
    cfg = {"dataset": {"source": "cifar10", "root": "/data/cifar"}}
    assert studies.dataset_text(studies.Stated.of(cfg).dataset, None) == "cifar10 (/data/cifar)"


# --- figures -----------------------------------------------------------------------------------
def only_text(fig) -> str:
    (ax,) = fig.axes
    assert not ax.lines  # nothing drawn
    return ax.texts[0].get_text()


def test_figures_without_data_say_so(tmp_path):
    assert only_text(figures.accuracy_vs_k({})) == "no data yet"
    assert only_text(figures.accuracy_vs_m({})) == "no data yet"
    assert only_text(figures.staleness(tmp_path, ["base"])) == "no cell with a queue yet"
    # a base group without a training log yet: nothing to draw
    base = studies.Group("base", {}, {"method": "moco"}, pd.DataFrame({"cell": ["base"]}))
    assert only_text(figures.bn_leak(tmp_path, {"base": base})) == "no shuffle_bn on/off cells yet"


# --- plan --------------------------------------------------------------------------------------
def test_plan_branches(tmp_path):
    p = section("pretrain", {**BASE_MOCO, "mechanism": "memory_bank"})
    assert plan.method_key(p) == "moco memory_bank"
    with pytest.raises(ConfigError, match="runtime 'soon' is neither minutes"):
        plan.minutes("soon")
    cfg = load_config(load_yaml(plan.DEFAULT_CONFIG))
    vit = Cell(section("pretrain", {"backbone": "vit_small", "variant": "v3"}), {})
    no_resnet = plan.detection_plan(cfg, {"base": vit}, {})
    assert no_resnet["jobs"] == 0 and no_resnet["note"] == "no detection transfer"
    with pytest.raises(ConfigError, match="--config epochs: expected key=value"):
        plan.merged_config([], ["epochs"])
    assert plan.merged_config([], ["results=/x"])["results"] == "/x"


def test_plan_cli_reports_a_bad_profile(tmp_path, capsys):
    assert plan.main(["--profile", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"plan: profile not found: {tmp_path / 'none'} (a folder with config.yaml)\n"


# --- environment -------------------------------------------------------------------------------
def test_environment_cli(tmp_path, capsys):
    lock = tmp_path / "tiny.lock"
    lock.write_text(TINY_LOCK)
    assert environment.main(["--lock", str(lock), "--subset", "PyYAML"]) == 0
    assert capsys.readouterr().out == "pyyaml==0.0.1 \\\n    --hash=sha256:aaaa\n    # via -r requirements.txt\n"
    assert environment.main(["--lock", str(lock)]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["lock_sha256"] == TINY_LOCK_SHA256 and env["packages"]["not-a-real-package"] is None
    assert environment.main(["--lock", str(lock), "--check"]) == 1  # 0.0.1 is not what is installed
    err = capsys.readouterr().err
    assert "pyyaml: locked 0.0.1, installed " in err and "not-a-real-package: locked 1.0, installed None" in err
    with pytest.raises(SystemExit, match="not in the lock: nope"):
        environment.subset(TINY_LOCK, ["nope"])


def test_a_line_without_an_exact_pin_is_no_entry_of_the_lock():
    # an entry starts only at name==version: the unpinned line (and its hash) belongs to none
    lock = "pyyaml>=6 \\\n    --hash=sha256:aaaa\nfoo==1.0 \\\n    --hash=sha256:bbbb\n"
    assert environment.locked_versions(lock) == {"foo": "1.0"}
