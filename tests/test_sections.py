"""Typed config sections (pipeline.dag.sections): every default defined once, in the dataclass;
the schema, config.yaml and the dataclasses agree key for key and value for value."""

import dataclasses

import pytest

from pipeline.dag import sections
from pipeline.dag.config import (
    DEFAULT_CONFIG,
    SECTION_TYPES,
    ConfigError,
    build,
    load_schema,
    load_yaml,
    pretrain_cell,
    section,
    to_dict,
    typed_sections,
)

NESTED = {
    ("dataset", "synthetic"): sections.Synthetic,
    ("detect", "rpn"): sections.Rpn,
    ("grid", "resources"): sections.Resources,
    ("grid", "supervised"): sections.SupervisedRecipe,
    ("detect", "voc"): sections.Voc,
    ("launch", "slurm"): sections.LaunchSlurm,
}


def schema_properties(name: str) -> dict:
    schema = load_schema()
    sub = schema["properties"][name]
    if "$ref" in sub:
        sub = schema["$defs"][sub["$ref"].split("/")[-1]]
    return sub


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("name", sorted(SECTION_TYPES))
def test_config_yaml_states_the_dataclass_defaults(name):
    """config.yaml's values are the defaults: building its section changes nothing."""
    values = load_yaml(DEFAULT_CONFIG)[name]
    if name == "grid":  # the demo's sweeps are an experiment design, not defaults (absent: no sweep)
        values = {k: v for k, v in values.items() if k not in sections.DESIGN}
    assert section(name, values) == SECTION_TYPES[name]()
    assert {k: to_dict(SECTION_TYPES[name]())[k] for k in values} == values  # as YAML reads them


@pytest.mark.parametrize("name", sorted(SECTION_TYPES))
def test_dataclass_fields_are_the_schema_keys(name):
    props = schema_properties(name)
    assert props.get("additionalProperties") is False  # unknown keys fail validation
    assert names(SECTION_TYPES[name]) == set(props["properties"])


@pytest.mark.parametrize("where, cls", sorted(NESTED.items(), key=str))
def test_nested_dataclass_fields_are_the_schema_keys(where, cls):
    name, key = where
    props = schema_properties(name)["properties"][key]
    assert props.get("additionalProperties") is False
    assert names(cls) == set(props["properties"])
    assert isinstance(getattr(SECTION_TYPES[name](), key), cls)  # the section holds it nested


def test_a_partial_dict_takes_the_defaults():
    det = build(
        sections.Detect,
        {
            "lr": 0.1,
            "rpn": {"pre_nms_train": 10, "post_nms_train": 5, "pre_nms_test": 4, "post_nms_test": 3},
            "train_sizes": [64, 80],
        },
    )
    assert det.lr == 0.1 and det.head == "fpn" and det.voc == sections.Voc()
    assert det.rpn == sections.Rpn(pre_nms_train=10, post_nms_train=5, pre_nms_test=4, post_nms_test=3)
    assert det.train_sizes == (64, 80)  # lists become tuples: the section cannot change
    assert to_dict(det)["train_sizes"] == [64, 80]  # and back to lists, as the JSON had them
    assert section("convert", {}) == sections.Convert()
    assert section("convert", {}).max_resolution == 64


def test_unknown_keys_are_refused():
    with pytest.raises(ConfigError, match="bogus"):
        section("probe", {"bogus": 1})


def test_to_dict_round_trips_a_stage_config():
    cfg = load_yaml(DEFAULT_CONFIG)
    typed = typed_sections({k: cfg[k] for k in ("data", "probe")})
    assert set(typed) == {"data", "probe"}
    assert {k: to_dict(v) for k, v in typed.items()} == {k: cfg[k] for k in ("data", "probe")}


# known exceptions: plain dicts inside the frozen grid section (its sweeps, axis -> values, and
# resources.backbone_cost, backbone -> factor); a stage could change them in place
MUTABLE = {"grid": {"one_at_a_time", "product", "resources"}}


@pytest.mark.parametrize("name", sorted(SECTION_TYPES))
def test_a_built_section_holds_nothing_mutable(name):
    """What building adds to a frozen dataclass: YAML's lists become tuples and nested dicts
    sections, so no stage can change its config in place; hashing fails on any list or dict
    left inside, or on a section declared without frozen=True."""
    typed = section(name, load_yaml(DEFAULT_CONFIG)[name])
    for f in dataclasses.fields(typed):
        if f.name not in MUTABLE.get(name, ()):
            hash(getattr(typed, f.name))
    if name not in MUTABLE:
        hash(typed)


def test_a_grid_cell_replaces_and_validates():
    base = section("pretrain", load_yaml(DEFAULT_CONFIG)["pretrain"])
    cell = pretrain_cell(base, {"K": 1024, "m": 0.9})
    assert to_dict(cell) == {**to_dict(base), "K": 1024, "m": 0.9}  # these two keys changed, no other
    assert (base.K, base.m) == (256, 0.99)  # the base cell unchanged
    with pytest.raises(ConfigError, match="pretrain.m"):
        pretrain_cell(base, {"m": 1.5})  # the schema's range
    with pytest.raises(ConfigError, match="K=100 is not a multiple"):
        pretrain_cell(base, {"K": 100})  # a cross-field rule
    with pytest.raises(ConfigError, match="bogus"):
        pretrain_cell(base, {"bogus": 1})
