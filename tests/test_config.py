"""Schema and cross-field validation: bad values fail with the key and the allowed range."""

import copy
from dataclasses import replace

import pytest
from conftest import BASE_MOCO

from pipeline import plan
from pipeline.dag.config import (
    DEFAULT_CONFIG,
    ConfigError,
    check_detector,
    check_pretrain,
    load_config,
    load_stage_config,
    load_yaml,
    read_command_line_values,
    section,
)
from pipeline.dag.grid import cell_params


@pytest.fixture()
def cfg():
    return copy.deepcopy(load_yaml(DEFAULT_CONFIG))


def test_default_config_is_valid(cfg):
    load_config(cfg)


@pytest.mark.parametrize(
    "section,key,value,expect",
    [
        ("pretrain", "m", 1.5, "pretrain.m"),
        ("pretrain", "m", -0.1, "minimum"),
        ("pretrain", "backbone", "resnet7", "resnet18"),
        ("pretrain", "T", 0, "exclusiveMinimum"),
        ("pretrain", "epochs", "ten", "integer"),
        ("pretrain", "bogus", 1, "bogus"),
        ("data", "loader", "dali", "ffcv"),
        ("probe", "lr", -1.0, "probe.lr"),
        ("pretrain", "bn_splits", 0, "pretrain.bn_splits"),
        ("pretrain", "bn_splits", 3, "bn_splits=3 does not divide the batch size 64"),
        ("grid", "seeds", 0, "grid.seeds"),
    ],
)
def test_bad_values_name_the_key(cfg, section, key, value, expect):
    cfg[section][key] = value
    with pytest.raises(ConfigError, match=expect):
        load_config(cfg)


@pytest.mark.parametrize(
    "section,key,value,expect",
    [
        ("detect", "lr", float("inf"), r"'detect.lr': inf is not a finite number"),
        ("probe", "knn_t", float("nan"), r"'probe.knn_t': nan is not a finite number"),
        ("pretrain", "m", float("nan"), r"'pretrain.m': nan is not a finite number"),
        ("pretrain", "epochs", 10**12, r"'pretrain.epochs'.*maximum"),
        ("pretrain", "epochs", 10.0, r"'pretrain.epochs'.*integer"),
        ("detect", "anchor_sizes", [32, 64, 128, 256, 1e12], r"'detect.anchor_sizes.4'"),
    ],
)
def test_numbers_must_be_finite_and_integers_bounded(cfg, section, key, value, expect):
    cfg[section][key] = value
    with pytest.raises(ConfigError, match=expect):
        load_config(cfg)


def test_yaml_inf_and_nan_are_refused(cfg, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("detect: {lr: .inf}\nprobe: {knn_t: .nan}\n")
    loaded = load_yaml(path)  # YAML's .inf and .nan: floats that no range check catches
    for name, key in (("detect", "lr"), ("probe", "knn_t")):  # each alone: the error names its key
        bad = {**cfg, name: {**cfg[name], **loaded[name]}}
        with pytest.raises(ConfigError, match=rf"'{name}\.{key}': (inf|nan) is not a finite number"):
            load_config(bad)


def test_every_integer_key_has_a_bound():
    """A 1e12-sized integer is a typo wherever it goes: each integer key of the schema has a maximum."""
    from pipeline.dag.config import load_schema

    unbounded = []

    def walk(node, path):
        if isinstance(node, dict):
            kind = node.get("type")
            if (kind == "integer" or isinstance(kind, list) and "integer" in kind) and "maximum" not in node:
                unbounded.append(path)
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for v in node:
                walk(v, path)

    walk(load_schema(), "")
    assert unbounded == []


def test_dataset_roots_may_hold_spaces_and_non_ascii_letters(cfg, tmp_path):
    root = tmp_path / "my data" / "Bilder-ü"
    root.mkdir(parents=True)
    cfg["dataset"].update(source="imagefolder", root=str(root))
    cfg["detect"]["root"] = str(root)
    load_config(cfg)


@pytest.mark.parametrize(
    "detect,expect",
    [
        ({"schedule": "step"}, "detect.lr_steps: the step schedule needs"),
        ({"schedule": "step", "lr_steps": [22000, 18000]}, "increasing order"),
        ({"iterations": 20000, "lr_steps": [18000, 22000]}, "reach beyond detect.iterations=20000"),
        ({"train_sizes": [480, 800], "image_size": 96, "max_image_size": None}, "exceed the longer side's cap 96"),
        ({"rpn": {"pre_nms_train": 0}}, "detect.rpn.pre_nms_train"),
        ({"task": "masks"}, r"'detect.task'.*'detection', 'segmentation'"),
        ({"task": "segmentation", "dataset": "voc"}, "detect.task: segmentation needs instance masks"),
    ],
)
def test_detection_schedule_and_scales_are_checked(cfg, detect, expect):
    cfg["detect"].update(detect)
    with pytest.raises(ConfigError, match=expect):
        load_config(cfg)


def test_segmentation_task_is_accepted(cfg):
    cfg["detect"]["task"] = "segmentation"
    assert load_config(cfg).detect.task == "segmentation"


def test_queue_must_be_multiple_of_batch(cfg):
    cfg["pretrain"].update(K=1000, batch_size=256)
    with pytest.raises(ConfigError, match="K=1000 is not a multiple of the global batch size 256"):
        load_config(cfg)


@pytest.mark.parametrize(
    "pretrain, expect",
    [
        ({"K": 1536, "batch_size": 512}, "K=1536 is not a multiple of 2 x the global batch size 512"),  # 2B keys a step
        ({"variant": "v3"}, "symmetric applies to MoCo v1/v2's queue"),
        ({"mechanism": "end_to_end"}, "symmetric applies to MoCo v1/v2's queue"),
    ],
)
def test_symmetric_loss_is_checked(cfg, pretrain, expect):
    cfg["pretrain"].update(symmetric=True, **pretrain)
    with pytest.raises(ConfigError, match=expect):
        load_config(cfg)


@pytest.mark.parametrize(
    "where, value, expect",
    [
        ("grid", {"supervised": {"aug": "imagenet"}}, r"grid.supervised.aug': 'imagenet' is not one of \['v1'"),
        ("grid", {"supervised": {"optimizer": "rmsprop"}}, r"is not one of \['auto', 'sgd', 'lars', 'adamw', None\]"),
        ("pretrain", {"lr_step_epochs": [8, 4]}, r"lr_step_epochs=\[8, 4\] must increase"),
        ("pretrain", {"epochs": 10, "lr_step_epochs": [4, 10]}, r"stay below epochs=10"),
    ],
)
def test_supervised_recipe_and_step_epochs_are_checked(cfg, where, value, expect):
    cfg[where].update(value)
    with pytest.raises(ConfigError, match=expect):
        load_config(cfg)


def test_shell_reaching_strings_are_restricted(cfg):
    cfg["results"] = "results; rm -rf /"
    with pytest.raises(ConfigError, match="results"):
        load_config(cfg)


def test_missing_dataset_root(cfg, tmp_path):
    cfg["dataset"].update(source="imagefolder", root=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="dataset.root: folder not found"):
        load_config(cfg, folders=True)


def test_stage_config_checks_only_its_sections(cfg):
    pretrain = __import__("json").dumps({**cfg["pretrain"], "m": 2})
    text = f'{{"data": {{"crop_size": 32}}, "pretrain": {pretrain}}}'
    with pytest.raises(ConfigError, match="pretrain.m"):
        load_stage_config(text, ["data", "pretrain"])


def test_impossible_cell_is_named(cfg):
    with pytest.raises(ConfigError, match="ablation cell 'K=1000' is impossible"):
        cell_params(load_config(cfg), "K=1000")


def test_fpn_needs_one_anchor_size_per_level(cfg):
    cfg["detect"]["anchor_sizes"] = [32, 64, 128]
    with pytest.raises(ConfigError, match=r"detect.anchor_sizes: the FPN head needs one size per pyramid level \(5\)"):
        load_config(cfg)
    cfg["detect"]["head"] = "c4"  # C4 puts every size on one feature map
    load_config(cfg)
    with pytest.raises(ConfigError, match="detect.anchor_sizes"):
        load_stage_config('{"detect": {"head": "fpn", "anchor_sizes": [8]}}', ["detect"])


def test_a_queue_as_large_as_the_training_set_is_a_warning_beside_the_memory_bank_rule():
    from pipeline.dag.config import pretrain_warnings

    p = section("pretrain", {"method": "moco", "variant": "v2", "K": 4096, "batch_size": 256})
    assert "K=4096 >= 4000 training images" in pretrain_warnings(p, 4000)[0]
    assert pretrain_warnings(p, 5000) == [] and pretrain_warnings(replace(p, mask_same_source=True), 4000) == []
    assert pretrain_warnings(replace(p, variant="v3"), 4000) == []  # no queue


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


@pytest.mark.parametrize(
    "protocol, error",
    [
        ({"trials": 3}, r"detect.protocols.more: trials cannot differ between protocols"),
        ({"norm": "batch"}, r"config key 'detect.protocols.more.norm': 'batch' is not one of"),
        ({"max_image_size": 64}, r"detect.protocols.more: detect.max_image_size=64 is below detect.image_size=96"),
    ],
)
def test_a_detection_protocol_is_checked_as_the_main_one(protocol, error):
    """detect.protocols: each protocol's keys over detect's pass the same schema and checks,
    and may not change what protocols share (the cells, the trials)."""
    load_config({"detect": {"protocols": {"frozen": {"norm": "frozen_bn"}}}})
    with pytest.raises(ConfigError, match=error):
        load_config({"detect": {"protocols": {"more": protocol}}})


def test_a_detection_protocol_may_not_take_the_main_protocols_name():
    """The tables and claims call detect's own protocol "main": a protocol of that name would be
    read as the other one."""
    with pytest.raises(ConfigError, match="detect.protocols.main: 'main' names detect's own protocol"):
        load_config({"detect": {"protocols": {"main": {"norm": "frozen_bn"}}}})
