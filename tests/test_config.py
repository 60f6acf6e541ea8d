"""Schema and cross-field validation: bad values fail with the key and the allowed range."""
import copy

import pytest

from pipeline.config import ConfigError, load_stage_config, load_yaml, validate, DEFAULT_CONFIG
from pipeline.grid import cell_params


@pytest.fixture()
def cfg():
    return copy.deepcopy(load_yaml(DEFAULT_CONFIG))


def test_default_config_is_valid(cfg):
    validate(cfg)


@pytest.mark.parametrize("section,key,value,expect", [
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
])
def test_bad_values_name_the_key(cfg, section, key, value, expect):
    cfg[section][key] = value
    with pytest.raises(ConfigError, match=expect):
        validate(cfg)


def test_queue_must_be_multiple_of_batch(cfg):
    cfg["pretrain"].update(K=1000, batch_size=256)
    with pytest.raises(ConfigError, match="K=1000 is not a multiple of the global batch size 256"):
        validate(cfg)


def test_shell_reaching_strings_are_restricted(cfg):
    cfg["results"] = "results; rm -rf /"
    with pytest.raises(ConfigError, match="results"):
        validate(cfg)


def test_missing_dataset_root(cfg, tmp_path):
    cfg["dataset"].update(source="imagefolder", root=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="dataset.root: folder not found"):
        validate(cfg)


def test_stage_config_checks_only_its_sections(cfg):
    text = '{"data": {"crop_size": 32}, "pretrain": %s}' % __import__("json").dumps({**cfg["pretrain"], "m": 2})
    with pytest.raises(ConfigError, match="pretrain.m"):
        load_stage_config(text, ["data", "pretrain"])


def test_impossible_cell_is_named(cfg):
    with pytest.raises(ConfigError, match="ablation cell 'K=1000' is impossible"):
        cell_params(cfg, "K=1000")


def test_fpn_needs_one_anchor_size_per_level(cfg):
    cfg["detect"]["anchor_sizes"] = [32, 64, 128]
    with pytest.raises(ConfigError, match=r"detect.anchor_sizes: the FPN head needs one size per pyramid level \(5\)"):
        validate(cfg)
    cfg["detect"]["head"] = "c4"  # C4 puts every size on one feature map
    validate(cfg)
    with pytest.raises(ConfigError, match="detect.anchor_sizes"):
        load_stage_config('{"detect": {"head": "fpn", "anchor_sizes": [8]}}', ["detect"])
