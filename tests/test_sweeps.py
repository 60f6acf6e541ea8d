"""pipeline.dag.sweeps: which studies a grid sweeps, the same for the Snakefile's outputs and the
tables stage, and a written study always has two or more rows of cells."""

import pytest
import yaml
from conftest import REPO

from pipeline.base.layout import STUDY_NAMES
from pipeline.dag.config import load_config, merge
from pipeline.dag.grid import grid_cells
from pipeline.dag.sweeps import command, drawn, fine_tuned, swept
from pipeline.methods.section import Pretrain
from pipeline.report.studies import collect, studies
from pipeline.tables import expected_cells

DEFAULT = yaml.safe_load((REPO / "workflow/config/config.yaml").read_text())
GRIDS = {
    # the demo: base, random init, supervised: nothing swept but the methods and the transfer
    "demo": ({}, ["methods", "detection", "segmentation", "grid"]),
    # the whole default grid: K, m and shuffle_bn one at a time (K alone is also Figure 3's MoCo column)
    "full": (
        {"grid": {"only": None}},
        ["methods", "ablation_K", "ablation_m", "mechanisms", "shuffle_bn", "detection", "segmentation", "grid"],
    ),
    "epochs and mechanisms, no transfer": (
        {
            "grid": {"only": None, "one_at_a_time": {"epochs": [26], "mechanism": ["memory_bank"]}, "baselines": []},
            "detect": {"enabled": False},
        },
        ["methods", "ablation_K", "ablation_m", "ablation_epochs", "mechanisms", "shuffle_bn", "grid"],
    ),
    "boxes only": ({"detect": {"task": "detection"}}, ["methods", "detection", "grid"]),
}


@pytest.mark.parametrize("name", GRIDS)
def test_swept_studies_of_a_grid(name):
    override, expected = GRIDS[name]
    cfg = load_config(merge(DEFAULT, override))
    cells = grid_cells(cfg)
    assert swept(cells, fine_tuned(cfg.detect, cells)) == expected


@pytest.mark.parametrize("name", GRIDS)
def test_a_swept_one_axis_study_has_two_rows_of_cells_and_another_at_most_one(name, tmp_path):
    """Against the tables' own selection: each study table, built from the grid's expected cells,
    has cells in two or more rows exactly when the sweep predicate says it is swept."""
    cfg = merge(DEFAULT, GRIDS[name][0])
    loaded = load_config(cfg)
    names = swept(grid_cells(loaded), fine_tuned(loaded.detect, grid_cells(loaded)))
    for table in studies(collect(tmp_path, expected_cells(cfg)), cfg, tmp_path):
        if table.name in ("methods", "grid", "detection", "segmentation") or table.name not in STUDY_NAMES:
            continue  # written from the base alone, or by detect.task
        with_cells = sum(1 for row in table.rows if row.cells)
        assert (with_cells >= 2) == (table.name in names), (table.name, with_cells)


def test_figures_follow_their_studies():
    assert drawn(["methods", "grid"]) == ["staleness", "methods"]
    assert drawn(["methods", "mechanisms", "shuffle_bn"]) == ["accuracy_vs_K", "staleness", "bn_leak", "methods"]
    assert drawn(["ablation_m"]) == ["accuracy_vs_m", "staleness", "methods"]


def test_the_command_of_a_study_uses_the_grids_values_or_an_example():
    base = Pretrain(K=256, epochs=13, shuffle_bn=True)
    assert command("ablation_K", base, {"K": [1024]}) == (
        "snakemake --config grid='{only: [base, K=1024], one_at_a_time: {K: [1024]}}'"
    )
    assert "only: [base, K=1024]" in command("ablation_K", base)  # 4 x the base's K
    assert "only: [base, epochs=26]" in command("ablation_epochs", base)  # 2 x, as the paper's 100 -> 200
    assert "{shuffle_bn: [false]}" in command("shuffle_bn", base)
    assert command("segmentation", base) == "snakemake --config detect='{enabled: true, task: segmentation}'"
