"""pipeline.report.studies: a cell's row from its folder, the probe settings the tables state, and
the labels and sentences of the tables."""

import json

import pandas as pd
import pytest

from pipeline.dag.config import ConfigError
from pipeline.dag.grid import parse_cell_id
from pipeline.report import studies
from pipeline.report.stats import Estimate


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


def test_a_table_takes_one_delta_column_per_metric():
    """Two Δ columns of one metric would be two footnotes on one column: refused, naming it."""
    table = studies.Table("main", "t", ["method"], ["top1", "AP50"], ["linear top-1", "AP50"], [])
    studies.compare(table, None, "random init", "top1")
    studies.compare(table, None, "supervised", "AP50")
    assert table.compared == [("top1", "random init"), ("AP50", "supervised")]
    with pytest.raises(ValueError, match="main: a second Δ column of top1"):
        studies.compare(table, None, "supervised", "top1")


def test_all_md_lists_no_unswept_study_when_every_one_is_swept():
    from pipeline.tables import not_swept_section

    assert not_swept_section([], {"grid": {"one_at_a_time": {"K": [1024]}}}) == ""
