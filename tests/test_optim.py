"""LARS (pipeline.nets.optim) against its definition, worked out by hand: MoCo v3's optimizer
(moco-v3 optimizer.py, You et al. 2017). Weights (ndim > 1) take weight decay and the trust
ratio trust_coefficient * ||w|| / ||g + wd w||; biases and normalisation parameters take
neither; then momentum SGD (buf = momentum * buf + update; w -= lr * buf)."""

import dataclasses

import pytest
import torch
from torch import nn

from pipeline.dag.config import section
from pipeline.methods.build import build_optimizer
from pipeline.methods.section import Pretrain
from pipeline.nets.optim import LARS, SGD, STEP_DROPS, AdamW, Schedule, share_of


def steps(params_and_grads, n, **hyper):
    """``n`` LARS steps, each with the same gradients; the parameters after each step."""
    params = [nn.Parameter(torch.tensor(p)) for p, _ in params_and_grads]
    opt = LARS(params, **hyper)
    after = []
    for _ in range(n):
        for p, (_, g) in zip(params, params_and_grads):
            p.grad = torch.tensor(g)
        opt.step()
        after.append([p.detach().clone() for p in params])
    return after


def test_lars_update_by_hand():
    hyper = dict(lr=1.0, weight_decay=0.1, momentum=0.9, trust_coefficient=0.001)
    weight = ([[3.0, 4.0]], [[0.3, 0.4]])  # ||w|| = 5
    bias = ([1.0, -2.0], [0.5, 0.5])
    zero_weight = ([[0.0, 0.0]], [[1.0, 0.0]])  # ||w|| = 0: ratio 1
    (w1, b1, z1), (w2, b2, z2) = steps([weight, bias, zero_weight], 2, **hyper)
    # step 1: g + 0.1 w = [0.6, 0.8] (norm 1), ratio 0.001 * 5 / 1 -> [0.003, 0.004] = buf
    torch.testing.assert_close(w1, torch.tensor([[2.997, 3.996]]))
    # step 2: w = 0.999 [3, 4], so g + 0.1 w = 0.9995 [0.6, 0.8]; ratio * that = 0.001 * 4.995 [0.6, 0.8]
    # = [0.002997, 0.003996]; buf = 0.9 [0.003, 0.004] + that = [0.005697, 0.007596]
    torch.testing.assert_close(w2, torch.tensor([[2.991303, 3.988404]]))
    # a bias: no weight decay, no ratio: buf 0.5, then 0.9 * 0.5 + 0.5 = 0.95
    torch.testing.assert_close(b1, torch.tensor([0.5, -2.5]))
    torch.testing.assert_close(b2, torch.tensor([-0.45, -3.45]))
    # a zero weight: ratio 1 (nothing to scale by) -> [-1, 0]; then ||w|| = 1, g + 0.1 w = [0.9, 0]
    # (norm 0.9), ratio 0.001 / 0.9 -> [0.001, 0]; buf = 0.9 [1, 0] + [0.001, 0]
    torch.testing.assert_close(z1, torch.tensor([[-1.0, 0.0]]))
    torch.testing.assert_close(z2, torch.tensor([[-1.901, 0.0]]))


def test_moco_v3_recipe_excludes_biases_and_norm_parameters():
    """build_optimizer on MoCo v3's ResNet recipe: LARS; after one step each weight moved by
    lr * trust_coefficient * ||w|| along -(g + wd w); each bias and BN parameter by -lr * g."""
    p = dataclasses.replace(Pretrain(), method="moco", variant="v3", backbone="resnet18", optimizer="auto")
    p = dataclasses.replace(p, lars_trust=0.02)  # the trust coefficient the config sets (0.001 by default)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    opt = build_optimizer(p, model.parameters())
    assert isinstance(opt, LARS)
    model(torch.randn(5, 3, 8, 8)).square().sum().backward()
    before = {n: (t.detach().clone(), t.grad.clone()) for n, t in model.named_parameters()}
    opt.step()
    moved = {n: t.detach() - before[n][0] for n, t in model.named_parameters()}
    assert sorted(n for n, t in model.named_parameters() if t.ndim > 1) == ["0.weight", "3.weight"]
    for name, (w, g) in before.items():
        if w.ndim > 1:
            u = g + p.weight_decay * w
            expected = -p.lr * 0.02 * w.norm() * u / u.norm()
        else:  # 0.bias, 1.weight, 1.bias (BN), 3.bias
            expected = -p.lr * g
        torch.testing.assert_close(moved[name], expected, rtol=1e-5, atol=1e-8, msg=name)


def test_lars_matches_timm_without_weight_decay():
    """timm.optim.Lars with MoCo v3's exclusion as parameter groups (weights adapted, biases and
    BN parameters plain momentum SGD), three steps. Only without weight decay: timm's trust
    ratio divides by ||g|| + wd ||w||, MoCo v3's by ||g + wd w|| (the hand test covers decay)."""
    from timm.optim import Lars

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))

    ours, theirs = model(), model()
    weights = [t for t in theirs.parameters() if t.ndim > 1]
    rest = [t for t in theirs.parameters() if t.ndim <= 1]
    optimizers = {
        ours: LARS(ours.parameters(), lr=0.5, momentum=0.9),
        theirs: Lars([{"params": weights, "always_adapt": True}, {"params": rest}], lr=0.5, momentum=0.9, eps=0.0),
    }
    x = torch.randn(5, 3, 8, 8)
    for _ in range(3):
        for net, opt in optimizers.items():
            opt.zero_grad()
            net(x).square().sum().backward()
            opt.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, msg=name)


def test_one_schedule_by_hand():
    """Every stage's schedule (pretraining, the probe, detection), in steps: cosine is
    ½(1 + cos πt) of the steps after warmup: 1 at the start, ½ half way, 0 at the end; step
    drops ×0.1 at each drop passed; warmup gives step s (s + 1) / warmup."""
    cosine = Schedule(1000)
    assert cosine.factor(0) == 1.0 and cosine.factor(1000) == pytest.approx(0.0, abs=1e-15)
    assert cosine.factor(500) == pytest.approx(0.5, abs=1e-15)
    assert cosine.factor(250) == pytest.approx((1 + 2**-0.5) / 2)
    warm = Schedule(1100, warmup=100)  # the cosine over the 1,000 steps after the warmup's 100
    assert [warm.factor(s) for s in (0, 49, 99)] == pytest.approx([0.01, 0.5, 1.0])
    assert warm.factor(100) == 1.0 and warm.factor(600) == pytest.approx(0.5, abs=1e-15)
    step = Schedule(24000, "step", 100, (18000, 22000))  # Detectron2's VOC schedule
    assert [step.factor(s) for s in (99, 17999, 18000, 21999, 22000)] == pytest.approx([1, 1, 0.1, 0.1, 0.01])
    moco = Schedule(200, "step", drops=share_of(200, STEP_DROPS))  # MoCo's drops at 120 and 160 of 200
    assert [moco.factor(s) for s in (119, 120, 159, 160, 199)] == pytest.approx([1, 0.1, 0.1, 0.01, 0.01])


def test_lars_leaves_a_group_without_gradients_as_it_was():
    """A parameter group none of whose tensors got a gradient (a frozen part) takes no step."""
    frozen, live = nn.Linear(3, 2), nn.Linear(3, 2)
    opt = LARS([{"params": frozen.parameters()}, {"params": live.parameters()}], lr=0.5)
    before = [t.detach().clone() for t in frozen.parameters()]
    live(torch.randn(4, 3)).sum().backward()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, frozen.parameters()))
    assert all("momentum_buffer" in opt.state[t] for t in live.parameters()) and not opt.state.keys() & set(
        frozen.parameters()
    )


def test_lars_leaves_a_parameter_without_gradient_untouched():
    from pipeline.nets.optim import LARS

    used, unused = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(3))
    opt = LARS([used, unused], lr=0.1)
    used.grad = torch.ones(2, 2)
    opt.step()
    assert torch.equal(unused, torch.ones(3)) and unused not in opt.state
    assert not torch.equal(used, torch.ones(2, 2))


def test_unknown_optimizer_is_named():
    from pipeline.methods.build import build_optimizer

    with pytest.raises(ValueError, match=r"unknown optimizer 'rmsprop' \(sgd, lars, adamw\)"):
        build_optimizer(section("pretrain", {"optimizer": "rmsprop"}), [torch.nn.Parameter(torch.ones(1))])


@pytest.mark.parametrize(
    "schedule, step, expected",
    [  # 100 epochs of 10 steps
        ({"warmup_epochs": 10}, 49, 0.5),  # step 49 of a 100-step linear warmup: (49 + 1) / 100
        ({"schedule": "step"}, 500, 1.0),  # before MoCo's drops at 60% and 80%
        ({"schedule": "step"}, 700, 0.1),
        ({"schedule": "step"}, 900, 0.01),
        ({"schedule": "step", "lr_step_epochs": [30, 60]}, 500, 0.1),  # epoch 50 of 100: one drop
    ],
)
def test_learning_rate_warmup_and_steps(schedule, step, expected):
    from pipeline.methods.build import pretrain_schedule

    p = section("pretrain", {"lr": 1.0, "epochs": 100, **schedule})
    assert pretrain_schedule(p, steps_per_epoch=10).factor(step) == pytest.approx(expected)


@pytest.mark.parametrize(
    "ours, reference, kwargs",
    [
        (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=5e-4)),
        (AdamW, torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.05)),
    ],
    ids=["sgd", "adamw"],
)
def test_eager_optimizers_step_as_torchs_and_share_its_state_dict(ours, reference, kwargs):
    """The stages' optimizers skip torch's compile wrappers, nothing else: five steps leave every
    weight bit for bit where torch's own class leaves it, and each loads the other's state dict
    (a checkpoint written by either resumes in the other)."""
    torch.manual_seed(0)
    start = [torch.randn(4, 3), torch.randn(3)]
    grads = [[torch.randn_like(w) for w in start] for _ in range(5)]
    runs = {}
    for cls in (ours, reference):
        weights = [nn.Parameter(w.clone()) for w in start]
        opt = cls(weights, **kwargs)
        for step_grads in grads:
            for w, g in zip(weights, step_grads):
                w.grad = g.clone()
            opt.step()
            opt.zero_grad()
        runs[cls] = (weights, opt)
    (mine, my_opt), (theirs, their_opt) = runs[ours], runs[reference]
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    assert all(w.grad is None for w in mine)  # zero_grad sets to None, as torch's
    my_opt.load_state_dict(their_opt.state_dict())
    their_opt.load_state_dict(my_opt.state_dict())
    for a, b in zip(my_opt.state_dict()["state"].values(), their_opt.state_dict()["state"].values()):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
