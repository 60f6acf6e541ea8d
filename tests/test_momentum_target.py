"""pipeline.methods.momentum_target: the momentum update refuses encoders of different structure."""

import pytest
import torch


def test_momentum_update_refuses_encoders_of_different_structure():
    from pipeline.methods.momentum_target import momentum_update

    key, query = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="key and query encoders differ in structure"):
        momentum_update(key, query, 0.99)
