"""pipeline.base.folders: the DAG counts the images that conversion reads, on a tree with every odd
case."""


def odd_tree(train):
    """A split with what conversion leaves out or takes once, and 7 images it takes."""
    for cls, names in {"a": ["1.png", "2.JPG", "3.txt", ".4.png"], "b": ["5.webp"], ".c": ["6.png"]}.items():
        (train / cls).mkdir(parents=True)
        for name in names:
            (train / cls / name).write_bytes(b"x")
    (train / "b" / "deep" / "deeper").mkdir(parents=True)
    (train / "b" / "deep" / "deeper" / "7.png").write_bytes(b"x")
    (train / "b" / "8.png").hardlink_to(train / "a" / "1.png")  # one file twice: taken once
    (train / "b" / "9.png").symlink_to(train / "a" / "2.JPG")  # again
    (train / "b" / "up").symlink_to(train, target_is_directory=True)  # a loop
    (train / "0.png").write_bytes(b"x")  # beside the class folders: no class
    (train / "d").mkdir()
    (train / "d" / "10.png").write_bytes(b"x")
    (train / "d" / "11.png").symlink_to(tmp := train.parent / "elsewhere.png")
    tmp.write_bytes(b"x")
    return train


def test_the_dag_counts_the_images_conversion_reads(tmp_path):
    """The epochs planned before conversion are those of the images it converts: one set of
    rules (pipeline.base.folders) for both, checked here on a tree with every odd case."""
    from pipeline.base.folders import count_images
    from pipeline.data.sources import scan_imagefolder, scan_unlabeled

    train = odd_tree(tmp_path / "train")
    # imagefolder: a/1.png, a/2.JPG, b/5.webp, b/deep/deeper/7.png, d/10.png, d/11.png (6);
    # not 3.txt, the hidden .4.png and .c/, 0.png beside the classes, 8.png and 9.png (1 and 2 again)
    assert count_images(train, "imagefolder") == len(scan_imagefolder(train, "train")) == 6
    # unlabeled: the same 6 and 0.png, at any depth
    assert count_images(train, "unlabeled") == len(scan_unlabeled(train, "train")) == 7
    assert count_images(train, "imagefolder", limit=2) == 2
    assert count_images(tmp_path / "absent", "imagefolder") is None
