"""pipeline.report.figures: a figure without data says so instead of drawing empty axes."""

import pandas as pd

from pipeline.report import figures, studies


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
