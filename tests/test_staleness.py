"""How stale the negatives are: the parameter sketch estimates the key encoder's movement since
each queued key was encoded; the drift it reports matches the exact one; it resumes exactly.
And a run whose loss sits at chance is reported as failed (the paper's m = 0 row)."""

import math

import pytest
import torch
from torch import nn

from pipeline.methods.moco.builder import MoCo
from pipeline.methods.moco.mechanisms import EndToEnd
from pipeline.methods.moco.model import projection_head
from pipeline.methods.moco.queue import KeyQueue
from pipeline.methods.moco.staleness import NegativeDrift, ParameterSketch, history_length
from pipeline.methods.moco.v3 import MoCoV3
from pipeline.nets.method import Encoder
from pipeline.nets.models import build_backbone
from pipeline.pretrain import failure


def small_encoder(seed=0):
    torch.manual_seed(seed)
    backbone = build_backbone({"backbone": "resnet18", "width": 8, "cifar_stem": True, "norm": "bn"})
    return Encoder(backbone, projection_head(backbone.out_dim, 16, mlp=True))


def flat(module):
    return torch.cat([p.detach().flatten().double() for p in module.parameters()])


def test_sketch_distances_estimate_parameter_distances():
    a, b = small_encoder(0), small_encoder(0)
    sketch_a, sketch_b = ParameterSketch(a, seed=3), ParameterSketch(b, seed=3)
    with torch.no_grad():  # b: a moved a little, as the key encoder between steps
        for p in b.parameters():
            p.add_(torch.randn_like(p) * 0.01 * p.abs().mean())
    exact = (flat(a) - flat(b)).norm()
    assert float((sketch_a() - sketch_b()).norm()) == pytest.approx(float(exact), rel=0.08)
    assert float(sketch_a().norm()) == pytest.approx(float(flat(a).norm()), rel=0.08)
    assert torch.equal(ParameterSketch(a, seed=3)(), sketch_a())  # the same bins every time


@pytest.mark.parametrize("policy, K, B, steps", [("fifo", 256, 64, 40), ("random", 32, 8, 100)])
def test_history_covers_every_key_the_queue_can_hold(policy, K, B, steps):
    """The real queue, filled step after step: at every step, each queued key was encoded at one
    of the last ``history_length`` steps, whose sketches NegativeDrift keeps."""
    queue, history = KeyQueue(K, 4, policy, seed=1), history_length(K, B, policy)
    oldest = 0
    for step in range(steps):
        queue.enqueue(torch.zeros(B, 4), torch.arange(B), torch.tensor(step))
        encoded = queue.enqueued_at[queue.enqueued_at >= 0]  # not the initial random fill (-1)
        oldest = max(oldest, step - int(encoded.min()))
    assert oldest < history
    if policy == "fifo":  # by hand: a key lives K/B = 4 steps (ages 0..3), exactly the history less one
        assert (oldest, history) == (3, 5)


@pytest.mark.parametrize("K, B", [(32, 8), (1024, 64), (65536, 256)])
def test_random_replacement_history_leaves_under_a_hundredth_of_a_key_out(K, B):
    """A key survives a step with probability 1 - B/K: of the K keys, K (1 - B/K)^H are expected
    to be older than a history of H steps; the module promises fewer than 0.01."""
    assert K * (1 - B / K) ** history_length(K, B, "random") < 0.01


def train_moco(policy, steps, K=32, B=8, seed=0, drift=None, model=None, start=0):
    """MoCo on random images; the key encoder's exact parameters after each step."""
    model = model or MoCo(
        small_encoder(seed), dim=16, K=K, m=0.9, T=0.2, shuffle_bn=False, queue_policy=policy, seed=seed
    )
    drift = drift or NegativeDrift(model.encoder_k, history_length(K, B, policy))
    opt = torch.optim.SGD(model.encoder_q.parameters(), lr=0.5)
    snapshots = {}
    for step in range(start, start + steps):
        x = torch.rand(B, 3, 16, 16, generator=torch.Generator().manual_seed(1000 * seed + step))
        loss, _, _ = model(x, x.flip(3), torch.arange(B) + step * B)
        opt.zero_grad()
        loss.backward()
        opt.step()
        drift.record(step)
        snapshots[step] = flat(model.encoder_k)
    return model, drift, snapshots


@pytest.mark.parametrize("policy", ["fifo", "random"])
def test_negative_drift_matches_the_exact_drift_of_the_queued_keys(policy):
    steps = 30
    model, drift, snaps = train_moco(policy, steps)
    now = snaps[steps - 1]
    at = model.queue.enqueued_at
    exact = torch.stack([(now - snaps[int(s)]).norm() / now.norm() for s in at])
    mean, worst = drift.measure(at)
    assert mean == pytest.approx(100 * float(exact.mean()), rel=0.1)
    assert worst == pytest.approx(100 * float(exact.max()), rel=0.1)
    assert worst > 0


def test_random_replacement_holds_staler_negatives_than_fifo():
    (fifo_model, fifo_drift, _), (model, drift, _) = train_moco("fifo", 60), train_moco("random", 60)
    fifo, rand = fifo_drift.measure(fifo_model.queue.enqueued_at), drift.measure(model.queue.enqueued_at)
    assert rand[1] > fifo[1]  # the oldest key under random replacement is older, so staler


def test_negative_drift_resumes_exactly():
    whole_model, whole, _ = train_moco("random", 24)
    model, first, _ = train_moco("random", 10)
    resumed = NegativeDrift(model.encoder_k, len(first.steps))
    resumed.load(first.state())
    model, resumed, _ = train_moco("random", 14, model=model, drift=resumed, start=10)
    # the optimizer restarts here (plain SGD has no state), so the weights match the whole run
    assert torch.equal(resumed.steps, whole.steps) and torch.allclose(resumed.sketches, whole.sketches)
    assert resumed.measure(model.queue.enqueued_at) == pytest.approx(whole.measure(whole_model.queue.enqueued_at))


def test_keys_of_the_initial_random_fill_are_not_counted():
    model = MoCo(small_encoder(), dim=16, K=32, m=0.9, T=0.2, shuffle_bn=False)
    drift = NegativeDrift(model.encoder_k, 5)
    assert all(math.isnan(x) for x in drift.measure(model.queue.enqueued_at))


# --- failure: diverged, or the loss at chance ---------------------------------------------------
def rows(*losses, candidates=257):
    return [
        {"epoch": e + 1, "loss": loss, "chance_loss": round(math.log(candidates), 5)} for e, loss in enumerate(losses)
    ]


def test_a_loss_at_chance_is_a_failure():
    # what m = 0 does on the embedded data: the loss climbs to ln(K + 1) and stays there
    moco = MoCo(
        small_encoder(), dim=16, K=32, m=0.9, T=0.2, shuffle_bn=False
    )  # MoCo's rule: the cross-entropy family's
    collapsed = failure(rows(5.16622, 5.54896, 5.54902, 5.54903), moco)
    assert collapsed == "collapsed: loss 5.549 at chance (5.549: every logit alike)"
    assert failure(rows(5.3, float("nan")), moco).startswith("diverged")
    assert failure(rows(5.2, 4.9, 4.5), moco) is None  # learning: well below chance
    assert failure(rows(5.5, 5.4, 5.45), moco) is None  # 5.45 < 0.99 ln 257 = 5.494: still learning
    assert failure([], moco) is None and failure([{"epoch": 1, "loss": 5.6}], moco) is None  # logs of older runs


class Constant(nn.Module):
    """An encoder whose every embedding is the same vector: every logit alike, the loss at chance."""

    def __init__(self, dim=4):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.w.expand(x.shape[0], -1)


def constant_queue(model: MoCo) -> MoCo:
    """Every queued key the constant encoder's own: every logit alike."""
    model.queue.keys.copy_(nn.functional.normalize(torch.ones_like(model.queue.keys), dim=1))
    return model


@pytest.mark.parametrize(
    "make, chance",
    [
        # one cross-entropy over the batch's 8 keys: ln 8
        (lambda: EndToEnd(Constant(), T=0.2, shuffle_bn=False), math.log(8)),
        # MoCo v3 logs 2T (CE1 + CE2): at T = 0.2, 0.4 (ln 8 + ln 8) = 1.664, not ln 8 = 2.079
        (lambda: MoCoV3(Constant(), nn.Identity(), T=0.2, m=0.99), 0.4 * 2 * math.log(8)),
        (lambda: MoCoV3(Constant(), nn.Identity(), T=1.0, m=0.99), 2.0 * 2 * math.log(8)),
        # MoCo v1/v2 over the positive and 16 queued keys: ln 17; symmetric adds the swapped
        # views' cross-entropy: ln 17 + ln 17
        (lambda: constant_queue(MoCo(Constant(), dim=4, K=16, m=0.9, T=0.2, shuffle_bn=False)), math.log(17)),
        (
            lambda: constant_queue(MoCo(Constant(), dim=4, K=16, m=0.9, T=0.2, shuffle_bn=False, symmetric=True)),
            2 * math.log(17),
        ),
    ],
)
def test_each_method_reports_its_own_chance_loss(make, chance):
    """The collapse rule compares the logged loss with Method.chance_loss: for each method, the
    loss its forward logs when every logit is alike."""
    model = make()
    x = torch.zeros(8, 3, 4, 4)
    loss, _, logits = model(x, x, torch.arange(8))
    assert float(loss.detach()) == pytest.approx(chance, rel=1e-5)
    assert model.chance_loss(logits.shape[1]) == pytest.approx(chance, rel=1e-9)


def test_parameter_sketch_follows_its_module_to_another_device():
    """The model moves to its training device after the sketch was made: the bins follow.
    "meta" (every torch has it) stands for the GPU; a move to meta makes new Parameter objects
    where a move to a GPU keeps them, so the sketch is pointed at the moved ones."""
    from pipeline.methods.moco.staleness import ParameterSketch

    module = torch.nn.Linear(3, 2)
    sketch = ParameterSketch(module, buckets=8)
    sketch.params = list(module.to("meta").parameters())
    out = sketch()
    assert out.device.type == "meta" and out.shape == (8,)
    assert {b.device.type for b in sketch.bins + sketch.signs} == {"meta"}
