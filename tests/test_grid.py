"""Grid expansion: readable ids, one-at-a-time and product designs, duplicates merged."""
import pytest

from pipeline.config import ConfigError
from pipeline.grid import cell_id, expand, parse_cell_id

BASE = {"method": "moco", "variant": "v2", "backbone": "resnet18", "K": 4096, "m": 0.99, "T": 0.2,
        "epochs": 10, "batch_size": 256, "lr": 0.06}


def grid(**g):
    return {"pretrain": dict(BASE), "grid": g}


def test_one_at_a_time():
    cells = expand(grid(one_at_a_time={"K": [1024, 4096], "m": [0.9, 0.999]}))
    assert set(cells) == {"base", "K=1024", "m=0.9", "m=0.999"}  # K=4096 is the base itself
    assert cells["K=1024"]["K"] == 1024 and cells["K=1024"]["m"] == 0.99


def test_product_and_merge_with_one_at_a_time():
    cells = expand(grid(one_at_a_time={"K": [1024]}, product={"K": [1024, 2048], "m": [0.9, 0.99]}))
    assert set(cells) == {"base", "K=1024", "K=1024,m=0.9", "K=2048", "K=2048,m=0.9"}


def test_baselines_are_cells():
    cells = expand(grid(baselines=["random", "supervised"]))
    assert set(cells) == {"base", "method=random", "method=supervised"}


def test_id_round_trip():
    params = {**BASE, "K": 1024, "m": 1e-05}
    cid = cell_id(BASE, params)
    assert cid == "K=1024,m=1e-05"
    assert parse_cell_id(cid) == {"K": 1024, "m": 1e-05}


def test_impossible_cell_rejected_at_expansion():
    with pytest.raises(ConfigError, match="cell 'K=1000'.*multiple"):
        expand(grid(one_at_a_time={"K": [1000]}))
    with pytest.raises(ConfigError, match="cell 'm=1.5'.*pretrain.m"):
        expand(grid(one_at_a_time={"m": [1.5]}))


def test_unknown_axis():
    with pytest.raises(ConfigError, match="unknown axis"):
        parse_cell_id("Q=3")
