"""pipeline.dag.training_set: the training set's size before and after conversion, from the
conversion's report when there is one (pretrain.min_steps' use of it: tests/test_min_steps.py)."""

import json

from pipeline.dag.config import load_config
from pipeline.dag.training_set import training_set


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
