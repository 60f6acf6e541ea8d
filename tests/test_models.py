"""pipeline.nets.models: an unknown backbone and an embedding the 2-d sin-cos table cannot fill are
refused."""

import pytest


def test_unknown_backbone_and_odd_embedding_are_refused():
    from pipeline.nets.models import ResNetBackbone, sincos_2d

    with pytest.raises(ValueError, match=r"unknown backbone 'resnet7' \(known: resnet18, .*vit_"):
        ResNetBackbone("resnet7")
    with pytest.raises(ValueError, match=r"embedding dim 6 must be a multiple of 4"):
        sincos_2d(2, 6)
