"""pipeline.methods.momentum_target: the EMA update and the schedule of its momentum."""

import pytest
import torch


def test_momentum_update_refuses_encoders_of_different_structure():
    from pipeline.methods.momentum_target import momentum_update

    key, query = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="key and query encoders differ in structure"):
        momentum_update(key, query, 0.99)


def tiny_target(m: float, schedule: str):
    """A two-by-two linear online encoder and its momentum target."""
    from pipeline.methods.momentum_target import MomentumTarget

    class Tiny(MomentumTarget):
        def __init__(self):
            super().__init__()
            self.encoder_q = torch.nn.Linear(2, 2)
            self.init_target(m, schedule)

    return Tiny()


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_m_zero_stays_zero_on_either_schedule(schedule):
    """m = 0 means no EMA: the target is the online encoder at every step. On the cosine (MoCo
    v3's, BYOL's) 1 - (1 - 0)(1 + cos(pi p))/2 would be 0.5 half-way; it must stay 0."""
    model = tiny_target(0.0, schedule)
    with torch.no_grad():
        model.encoder_q.weight.add_(1.0)
    for progress in (0.0, 0.5, 0.99):
        model.on_step(progress)
        assert model.m == 0.0
        model.update_target()
        assert torch.equal(model.encoder_k.weight, model.encoder_q.weight)


def test_cosine_from_a_nonzero_m_still_rises():
    """The m = 0 rule does not freeze the schedule: from 0.99, half-way is
    1 - 0.01 x (1 + cos(pi / 2)) / 2 = 0.995."""
    model = tiny_target(0.99, "cosine")
    model.on_step(0.5)
    assert model.m == pytest.approx(0.995)
