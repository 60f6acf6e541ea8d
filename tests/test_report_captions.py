"""The HTML report's captions (workflow/report/*.rst) say what the tables and figures hold: the
detector the config fine-tunes, the reference of each table's Δ column, every method the main
table can hold, what "a ± b" and "fail" mean. Issue 49: they had gone stale ("Faster R-CNN" under
Mask R-CNN tables, "a ± b" as the standard deviation under 95 % CIs)."""

import re
from types import SimpleNamespace

import jinja2
import pytest
import yaml
from conftest import REPO

from pipeline.base.layout import CLAIMS_TABLES, FIGURES, STUDY_NAMES
from pipeline.dag.config import merge
from pipeline.methods import METHODS
from pipeline.report.studies import DETECTORS, HEAD_LABELS, METRICS, collect, studies
from pipeline.report.writers import FOOTNOTES
from pipeline.tables import expected_cells

CAPTIONS = REPO / "workflow" / "report"
DEFAULT = yaml.safe_load((REPO / "workflow/config/config.yaml").read_text())


def caption(name: str, cfg: dict = DEFAULT) -> str:
    """A caption as Snakemake's report renders it (Jinja, with ``snakemake.config``)."""
    text = (CAPTIONS / f"{name}.rst").read_text()
    return " ".join(jinja2.Template(text).render(snakemake=SimpleNamespace(config=cfg)).split())


def test_every_table_and_figure_has_a_caption():
    for name in [*STUDY_NAMES, *CLAIMS_TABLES, *FIGURES, "main", "curves", "workflow"]:
        assert (CAPTIONS / f"{name}.rst").is_file(), name


@pytest.mark.parametrize("task", sorted(DETECTORS))
@pytest.mark.parametrize("head", sorted(HEAD_LABELS))
def test_the_transfer_captions_name_the_detector_the_config_fine_tunes(task, head):
    cfg = merge(DEFAULT, {"detect": {"task": task, "head": head}})
    model, other = DETECTORS[task][0], DETECTORS["detection" if task == "segmentation" else "segmentation"][0]
    for name in ("workflow", "detection"):
        text = caption(name, cfg)
        assert model in text and HEAD_LABELS[head] in text and other not in text, (name, text)
    assert HEAD_LABELS[head] in caption("segmentation", cfg)
    assert "transfer to" not in caption("workflow", merge(cfg, {"detect": {"enabled": False}}))


def test_each_delta_column_is_named_with_its_metric_and_reference():
    """Against the tables themselves: each table's paired-Δ column (Table.compared) is a
    sentence of its caption naming the metric and the reference row."""
    tables = studies(collect(REPO / "nowhere", expected_cells(DEFAULT)), DEFAULT, REPO / "nowhere")
    checked = 0
    for table in tables:
        if not (CAPTIONS / f"{table.name}.rst").is_file():
            continue
        sentences = re.split(r"(?<=\.) ", caption(table.name))
        for metric, label in table.compared:
            assert any(METRICS[metric] in s and label in s and "minus" in s for s in sentences), (table.name, label)
            checked += 1
    assert checked >= 8  # methods, the ablations, mechanisms aside (no Δ), shuffle_bn, detection, ...


def test_the_main_captions_name_every_registered_method():
    shipped = [s for s in METHODS.values() if s.build is None or s.build.__module__.startswith("pipeline.")]
    for name in ("main", "methods"):
        text = caption(name)
        for spec in shipped:
            assert spec.label in text, (name, spec.label)


def test_a_plus_minus_b_and_fail_mean_what_the_tables_footnotes_say():
    text = caption("workflow")
    assert "the half-width of its 95 % confidence interval (Student t" in FOOTNOTES["(n="]
    assert "the half-width of its 95 % confidence interval (Student t" in text
    assert "standard deviation" not in text
    assert "its method's own failure rule" in text  # not only "sat at chance": BYOL fails by collapse
