"""SimCLR (pipeline/methods/simclr): NT-Xent by its definition, its 2N - 2 negatives, its chance
loss, its recipe by the paper's rule, and a real pretraining on the embedded data."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pipeline import pretrain
from pipeline.dag.config import load_config
from pipeline.dag.grid import grid_cells
from pipeline.methods.simclr.model import SimCLR, nt_xent

DATA = {"crop_size": 32, "workers": 1}


def nt_xent_by_definition(z1, z2, T, kept=None):
    """SimCLR's l(i, j) = -log exp(s_ij / T) / sum_{k != i} exp(s_ik / T), one anchor at a time,
    at the official code's scale: the mean over the first views' anchors plus the mean over the
    second views' (the paper's eq. averages all 2N: half of it). ``kept``: row -> the columns its
    denominator sums over (default: every one but itself)."""
    z = torch.cat([z1, z2]).double()
    n2, total = len(z), 0.0
    for i in range(n2):
        j = (i + n2 // 2) % n2
        columns = kept[i] if kept is not None else [k for k in range(n2) if k != i]
        denom = sum(math.exp(float(z[i] @ z[k]) / T) for k in columns)
        total += -math.log(math.exp(float(z[i] @ z[j]) / T) / denom)
    return total / (n2 // 2)


def test_nt_xent_is_the_reference_loss():
    torch.manual_seed(0)
    z1, z2 = F.normalize(torch.randn(5, 8), dim=1), F.normalize(torch.randn(5, 8), dim=1)
    loss, logits, target = nt_xent(z1, z2, T=0.1)
    assert float(loss) == pytest.approx(nt_xent_by_definition(z1, z2, 0.1), rel=1e-5)
    # each row: its positive (the other view), 2N - 2 negatives, itself masked out
    assert logits.shape == (10, 10) and torch.isinf(logits.diagonal()).all()
    assert int(torch.isfinite(logits).sum(1)[0]) == 1 + 2 * 5 - 2
    assert target.tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]


def test_masked_negatives_keep_the_positive_and_a_fresh_draw_of_that_many():
    """negatives=3 of a batch of 6 (10 negatives a view): every row keeps its positive and 3 other
    views, never itself; the loss sums over just those; the next step draws others."""
    torch.manual_seed(0)
    z1, z2 = F.normalize(torch.randn(6, 8), dim=1), F.normalize(torch.randn(6, 8), dim=1)
    loss, logits, target = nt_xent(z1, z2, T=0.1, negatives=3)
    finite = torch.isfinite(logits)
    assert finite.sum(1).tolist() == [4] * 12
    assert finite[torch.arange(12), target].all() and not finite.diagonal().any()
    kept = {i: torch.nonzero(finite[i]).flatten().tolist() for i in range(12)}
    assert float(loss) == pytest.approx(nt_xent_by_definition(z1, z2, 0.1, kept), rel=1e-5)
    _, again, _ = nt_xent(z1, z2, T=0.1, negatives=3)
    assert not torch.equal(torch.isfinite(again), finite)
    with pytest.raises(ValueError, match="negatives=11: a row has only 10"):
        nt_xent(z1, z2, T=0.1, negatives=11)


class Constant(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.w.expand(x.shape[0], -1)


@pytest.mark.parametrize("negatives,candidates", [(None, 15), (3, 4)])
def test_a_constant_encoder_sits_at_its_chance_loss_and_is_flagged(negatives, candidates):
    """Every view alike: each direction's loss is ln of the candidates a row keeps (its positive and
    its 2N - 2 negatives, or ``negatives`` of them), both directions summed; the cross-entropy
    family's rule flags it."""
    model = SimCLR(Constant(), T=0.1, negatives=negatives)
    x = torch.zeros(8, 3, 4, 4)
    loss, metrics, _ = model(x, x)
    loss = loss.detach()
    assert float(loss) == pytest.approx(2 * math.log(candidates), rel=1e-5)
    assert metrics["chance_loss"] == pytest.approx(2 * math.log(candidates)) and float(metrics["inst_acc"]) == 0.0
    row = {"epoch": 1, "loss": float(loss), "chance_loss": metrics["chance_loss"]}
    assert model.failure(row).startswith("collapsed")
    assert model.failure({**row, "loss": 0.5 * float(loss)}) is None


def test_the_recipe_follows_the_papers_rule_at_every_batch():
    """SimCLR's cells take LARS, lr 0.3 x B/256, weight decay 1e-6, T 0.1 (the paper's), at the base
    batch and at 4x it; the cell's own values win."""
    cfg = load_config({"grid": {"one_at_a_time": {"batch_size": [256]}, "baselines": ["simclr"]}})
    cells = grid_cells(cfg)
    simclr = cells["method=simclr"].pretrain
    assert (simclr.optimizer, simclr.lr, simclr.weight_decay, simclr.T) == ("lars", 0.3 * 64 / 256, 1e-6, 0.1)
    assert cells["base"].pretrain.lr == 0.015  # MoCo's base cell keeps its own
    from pipeline.dag.grid import cell_params

    big = cell_params(cfg, "method=simclr,batch_size=256").pretrain
    assert big.batch_size == 256 and big.lr == pytest.approx(0.3)
    own = cell_params(load_config({"grid": {"simclr": {"T": 0.2}}}), "method=simclr").pretrain
    assert own.T == 0.2 and own.optimizer == "lars"


def test_simclr_pretrains_on_the_embedded_data(ffcv_small, tmp_path):
    """A real run through the stage: it logs what SimCLR reports (instance accuracy over the 2N - 1
    other views, its chance loss) and has no momentum target to check. (That it learns is
    tests/test_methods.py's: the instance loss on fresh views falls.)"""
    params = {"method": "simclr", "width": 8, "dim": 16, "mlp_dim": 32, "epochs": 2, "batch_size": 16}
    params |= {"lr": 0.3, "optimizer": "lars", "T": 0.1, "knn_every": 0}
    summary = pretrain.run({"data": DATA, "pretrain": params}, ffcv_small, tmp_path / "out", tmp_path / "state", False)
    final = summary["final"]
    assert summary["key_encoder"] is None and summary["bn_guard"].startswith("not applicable")
    assert final["chance_loss"] == pytest.approx(2 * math.log(31), abs=1e-4)  # 2 x 16 views, less itself, x 2
    assert 0 <= final["inst_acc"] <= 100 and math.isfinite(final["loss"])


def test_more_negatives_than_a_view_has_are_refused():
    from pipeline.dag.config import ConfigError, section

    assert section("pretrain", {"method": "simclr", "batch_size": 64, "negatives": 126}).negatives == 126
    with pytest.raises(ConfigError, match=r"negatives=127 is more than a view has at batch_size 64 \(126"):
        load_config({"pretrain": {"method": "simclr", "negatives": 127}})


def test_simclr_and_byol_take_lars_under_optimizer_auto():
    """A config whose base cell is SimCLR or BYOL (a preset's) trains with its paper's optimiser."""
    from pipeline.methods.section import Pretrain

    assert Pretrain(method="simclr").optimizer_name == Pretrain(method="byol").optimizer_name == "lars"
    assert Pretrain().optimizer_name == "sgd"  # MoCo v2's


@pytest.mark.parametrize("method", [{"method": "simclr"}, {"method": "byol"}, {"variant": "v3"}])
def test_global_bn_methods_are_refused_across_cpu_ranks(method):
    """SimCLR, BYOL and MoCo v3 normalise over the global batch; on 2 CPU ranks each would see
    half of it: refused, naming where the ranks are set. One CPU process, or GPU ranks, build."""
    from pipeline.dag.config import ConfigError, section
    from pipeline.methods.build import build_model, check_global_bn

    p = section("pretrain", {**method, "width": 8, "dim": 16, "mlp_dim": 32, "batch_size": 16})
    model = build_model(p, 32, 10, 100, world_size=2)
    with pytest.raises(ConfigError, match=r"on 2 CPU ranks each would normalise its own 8 images.*tasks_per_node"):
        check_global_bn(model, p, torch.device("cpu"), 2)
    check_global_bn(model, p, torch.device("cpu"), 1)
    check_global_bn(model, p, torch.device("cuda", 0), 2)  # a device object only: SyncBN's case
    moco_v2 = section("pretrain", {"width": 8, "dim": 16, "batch_size": 16, "K": 32})
    check_global_bn(build_model(moco_v2, 32, 10, 100, world_size=2), moco_v2, torch.device("cpu"), 2)  # ShuffleBN
