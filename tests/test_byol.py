"""BYOL (pipeline/methods/byol): its loss by definition, its momentum target (the part MoCo
shares), its collapse measure and failure rule, and a real pretraining on the embedded data."""

import math

import pytest
import torch
from torch import nn

from pipeline import pretrain
from pipeline.dag.config import section
from pipeline.methods.build import build_model, build_optimizer
from pipeline.methods.byol.model import BYOL, SPREAD_FLOOR, regression_loss, spread
from pipeline.methods.moco.builder import MoCo
from pipeline.methods.momentum_target import MomentumTarget
from pipeline.nets.method import Encoder

DATA = {"crop_size": 32, "workers": 1}
SMALL = {"method": "byol", "width": 8, "dim": 16, "mlp_dim": 32, "batch_size": 16, "knn_every": 0}


def test_the_loss_is_two_minus_twice_the_cosine():
    p, z = torch.tensor([[3.0, 4.0], [1.0, 0.0]]), torch.tensor([[4.0, 3.0], [0.0, 2.0]])
    # cosines 24/25 and 0: (2 - 48/25 + 2 - 0) / 2
    assert float(regression_loss(p, z)) == pytest.approx((2 - 48 / 25 + 2) / 2)


def test_spread_is_zero_for_a_point_and_about_one_for_outputs_over_the_sphere():
    assert float(spread(torch.ones(64, 16) * 3)) == pytest.approx(0.0, abs=1e-6)
    torch.manual_seed(0)
    assert float(spread(torch.randn(4096, 16))) == pytest.approx(1.0, abs=0.05)  # each dim's std ~ 1/sqrt(d)


def test_byol_and_moco_share_one_momentum_target():
    """The EMA target is one part: the same class, the same update and schedule code."""
    byol = build_model(section("pretrain", SMALL), 32, 10, 64)
    moco = build_model(section("pretrain", {**SMALL, "method": "moco", "K": 32}), 32, 10, 64)
    assert isinstance(byol, BYOL) and isinstance(moco, MoCo)
    assert isinstance(byol, MomentumTarget) and isinstance(moco, MomentumTarget)
    assert type(byol).update_target is type(moco).update_target is MomentumTarget.update_target


def test_one_step_follows_the_ema_rule_and_never_moves_the_target_by_gradient():
    torch.manual_seed(0)
    model = build_model(section("pretrain", SMALL), 32, 10, 64)
    opt = build_optimizer(section("pretrain", {**SMALL, "lr": 0.1, "optimizer": "lars"}), model.parameters())
    x1, x2 = torch.randn(16, 3, 32, 32), torch.randn(16, 3, 32, 32)
    model.on_step(0.5)  # cosine: tau = 1 - (1 - 0.99) (1 + cos(pi / 2)) / 2 = 0.995
    assert model.m == pytest.approx(0.995)
    k0 = [p.detach().clone() for p in model.encoder_k.parameters()]
    q0 = [p.detach().clone() for p in model.encoder_q.parameters()]
    loss, metrics, _ = model(x1, x2)
    loss.backward()
    opt.step()
    for k, before_k, before_q in zip(model.encoder_k.parameters(), k0, q0):
        assert torch.allclose(k, 0.995 * before_k + 0.005 * before_q, atol=1e-7)  # the EMA of theta_q before the step
        assert k.grad is None and not k.requires_grad
    target_ids = {id(p) for p in model.encoder_k.parameters()}
    assert not target_ids & {id(p) for g in opt.param_groups for p in g["params"]}
    assert not target_ids & {id(p) for p in opt.state}
    assert set(metrics) == {"spread"} and 0 < float(metrics["spread"]) <= 1.0 + 1e-6


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_the_papers_end_points_of_tau_hold_for_the_whole_run(tau):
    """BYOL Table 5a's tau = 0 (the target is the online network behind a stop-gradient) and
    tau = 1 (a fixed random target) are constants: no cosine raises 0 towards 1."""
    torch.manual_seed(0)
    model = build_model(section("pretrain", {**SMALL, "m": tau}), 32, 10, 64)
    with torch.no_grad():  # move the online encoder away from the target
        for p in model.encoder_q.parameters():
            p.add_(1.0)
    for progress in (0.0, 0.5, 0.99):
        model.on_step(progress)
        assert model.m == tau
    k0 = [p.detach().clone() for p in model.encoder_k.parameters()]
    model(torch.randn(16, 3, 32, 32), torch.randn(16, 3, 32, 32))
    expected = k0 if tau == 1.0 else [p.detach() for p in model.encoder_q.parameters()]
    assert all(torch.equal(k, e) for k, e in zip(model.encoder_k.parameters(), expected))


class ConstantBackbone(nn.Module):
    """Every image to one feature vector: a collapsed encoder."""

    out_dim = 8

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return self.bias.expand(x.shape[0], -1)


def test_a_collapsed_byol_is_flagged_by_its_own_rule():
    """A constant output spreads 0: below the floor, so the run fails; the cross-entropy rule (a
    loss at chance) would read BYOL backwards, its collapsed loss is its minimum, 0."""
    from pipeline.methods.byol.model import BYOL as Byol
    from pipeline.nets.method import Encoder

    model = Byol(Encoder(ConstantBackbone(), nn.Identity()), predictor=None, m=0.99)
    loss, metrics, _ = model(torch.zeros(8, 3, 4, 4), torch.ones(8, 3, 4, 4))
    loss = loss.detach()
    assert float(loss) == pytest.approx(0.0, abs=1e-6)  # collapsed: the loss at its minimum
    row = {"epoch": 1, "loss": float(loss), "spread": round(float(metrics["spread"]), 5)}
    assert pretrain.failure([row], model).startswith("collapsed: spread")
    assert pretrain.failure([{**row, "spread": 2 * SPREAD_FLOOR}], model) is None
    assert pretrain.failure([{**row, "loss": math.nan}], model).startswith("diverged")


@pytest.mark.parametrize("predictor", [True, False])
def test_byol_pretrains_on_the_embedded_data(ffcv_small, tmp_path, predictor):
    """A real run through the stage: the target passes the run's own EMA check, the log holds
    what BYOL reports (its spread, m, drift: no instance accuracy, no chance loss)."""
    params = {**SMALL, "predictor": predictor, "epochs": 2, "lr": 0.2 * 16 / 256, "optimizer": "lars", "m": 0.99}
    summary = pretrain.run({"data": DATA, "pretrain": params}, ffcv_small, tmp_path / "out", tmp_path / "state", False)
    final = summary["final"]
    assert summary["key_encoder"]["holds"] and final["m"] > 0.99
    assert "spread" in final and "inst_acc" not in final and "chance_loss" not in final
    header = (tmp_path / "out" / "log.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["epoch", "loss", "spread"] and "inst_acc" not in header
    if predictor:
        assert summary["failure"] is None and final["spread"] > SPREAD_FLOOR


def test_a_momentum_schedule_must_be_known():
    with pytest.raises(ValueError, match="momentum schedule 'linear' is not one of constant, cosine"):
        BYOL(Encoder(ConstantBackbone(), nn.Identity()), None, m=0.99).init_target(0.99, schedule="linear")


def test_a_byol_cells_curves_show_its_spread(tmp_path):
    """The cell's curves plot what BYOL reports (its spread), not an instance accuracy it has not."""
    from pipeline.pretrain import rows_to_csv
    from pipeline.report import figures

    log = tmp_path / "cells" / "method=byol" / "pretrain" / "log.csv"
    log.parent.mkdir(parents=True)
    log.write_text(rows_to_csv([{"epoch": e, "loss": 1.0 / e, "spread": 0.5, "lr": 0.1, "m": 0.99} for e in (1, 2)]))
    fig = figures.curves(tmp_path, "method=byol", "ok")
    labels = [line.get_label() for line in fig.axes[1].lines]
    assert labels == ["output spread x 100 (pretext)"]
    assert list(fig.axes[1].lines[0].get_ydata()) == [50.0, 50.0]
