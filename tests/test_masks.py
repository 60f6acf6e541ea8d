"""pipeline.eval.masks: COCO polygons and uncompressed RLE decode to the pixels they cover."""

import numpy as np


def test_polygons_decode_to_their_union():
    from pipeline.eval.masks import decode

    a = [0, 0, 4, 0, 4, 4, 0, 4]  # square (0,0)-(4,4): pycocotools fills rows/cols 0..3, 16 pixels
    b = [5, 5, 8, 5, 8, 8, 5, 8]  # square (5,5)-(8,8): rows/cols 5..7, 9 pixels
    one = decode([a], 10, 10)
    assert one.shape == (10, 10) and one.dtype == np.uint8
    assert one.sum() == 16 and one[:4, :4].all()
    both = decode([a, b], 10, 10)
    assert both.sum() == 16 + 9  # disjoint: the union's area is the sum
    assert both[:4, :4].all() and both[5:8, 5:8].all()


def test_uncompressed_rle_decodes():
    from pipeline.eval.masks import decode

    # column-major counts: 5 zeros, 3 ones (column 1, rows 1..3), 8 zeros
    mask = decode({"size": [4, 4], "counts": [5, 3, 8]}, 4, 4)
    expected = np.zeros((4, 4), np.uint8)
    expected[1:4, 1] = 1
    assert np.array_equal(mask, expected)
