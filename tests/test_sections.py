"""Typed config sections (pipeline.dag.sections): every key declared once, in the dataclass;
the schema is derived from them and config.yaml states their defaults and names their values."""

import dataclasses
import re

import pytest

from pipeline.dag import sections
from pipeline.dag.config import (
    DEFAULT_CONFIG,
    SECTION_TYPES,
    ConfigError,
    load_schema,
    load_stage_config,
    load_yaml,
    pretrain_cell,
    section,
    to_dict,
)

NESTED = {
    ("dataset", "synthetic"): sections.Synthetic,
    ("detect", "rpn"): sections.Rpn,
    ("grid", "resources"): sections.Resources,
    ("grid", "supervised"): sections.MethodRecipe,
    ("detect", "voc"): sections.Voc,
    ("launch", "slurm"): sections.LaunchSlurm,
}


def schema_properties(name: str) -> dict:
    return load_schema()["properties"][name]


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
def test_every_section_refuses_a_key_it_does_not_declare(name):
    with pytest.raises(ConfigError, match=rf"config key '{name}': Additional properties .*'bogus' was unexpected"):
        load_stage_config({name: {"bogus": 1}}, [name])


@pytest.mark.parametrize("where, cls", sorted(NESTED.items(), key=str))
def test_nested_sections_refuse_a_key_they_do_not_declare(where, cls):
    name, key = where
    assert isinstance(getattr(SECTION_TYPES[name](), key), cls)  # the section holds it nested
    with pytest.raises(ConfigError, match=rf"config key '{name}.{key}': Additional properties"):
        load_stage_config({name: {key: {"bogus": 1}}}, [name])


def test_the_schema_takes_each_keys_type_from_its_annotation_and_its_rules_from_its_declaration():
    """By hand, from sections.py: K is `int`, >= 1; bn_splits `int | None`; optimizer an enum;
    grid.supervised's keys are pretrain's, or null; claims.pilot_seeds is never 1."""
    pretrain = schema_properties("pretrain")["properties"]
    assert pretrain["K"]["type"] == "integer" and pretrain["K"]["minimum"] == 1
    assert pretrain["bn_splits"]["type"] == ["integer", "null"]
    assert pretrain["optimizer"]["enum"] == ["auto", "sgd", "lars", "adamw"] and "type" not in pretrain["optimizer"]
    assert pretrain["lr_step_epochs"]["type"] == ["array", "null"]
    recipe = schema_properties("grid")["properties"]["supervised"]["properties"]
    assert recipe["optimizer"]["enum"] == ["auto", "sgd", "lars", "adamw", None]
    assert recipe["lr"] == {"type": ["number", "null"], "exclusiveMinimum": 0}
    for bad in ({"pretrain": {**to_dict(sections.Pretrain()), "K": 2.5}}, {"claims": {"pilot_seeds": 1}}):
        with pytest.raises(ConfigError):
            load_stage_config(bad, list(bad))
    load_stage_config({"grid": {"supervised": {"optimizer": None, "lr": None}}}, ["grid"])


def test_a_key_that_may_be_null_takes_null_among_its_enum_or_its_types():
    """The derivation on a section of its own (no config key is both an enum and nullable yet)."""
    from dataclasses import dataclass

    from pipeline.base.keys import key
    from pipeline.dag.schema import section_schema

    @dataclass(frozen=True, kw_only=True)
    class Toy:
        mode: str | None = key(None, "a choice or none", enum=["a", "b"])
        size: int | None = key(None, minimum=1)
        name: str = key("x", enum=["x", "y"])

    props = section_schema(Toy)["properties"]
    assert props["mode"] == {"enum": ["a", "b", None], "description": "a choice or none"}
    assert props["size"] == {"type": ["integer", "null"], "minimum": 1}
    assert props["name"] == {"enum": ["x", "y"]}


def commented_keys(path) -> dict[str, str]:
    """config.yaml's keys (dotted) -> their comment, continuation lines included."""
    comments, stack, last = {}, [], None
    for line in path.read_text().splitlines():
        body, _, comment = line.partition("#")
        if not body.strip():  # a comment line: continues the key above it when indented under its value
            if last and line.startswith(" " * 10) and comment:
                comments[last] += " " + comment.strip()
            continue
        match = re.match(r"^( *)([A-Za-z_0-9]+):", body)
        if not match:
            continue
        depth = len(match.group(1)) // 2
        stack = [*stack[:depth], match.group(2)]
        last = ".".join(stack)
        comments[last] = comment.strip()
    return comments


def test_config_yaml_names_every_value_of_a_key_whose_comment_lists_them():
    """Where config.yaml's comment lists a key's choices (a | b), it lists the schema's enum."""
    schema, checked = load_schema(), 0
    for dotted, comment in commented_keys(DEFAULT_CONFIG).items():
        node = schema
        for part in dotted.split("."):
            node = node.get("properties", {}).get(part, {})
        choices = [v for v in node.get("enum", ()) if isinstance(v, str)]
        if choices and " | " in comment:
            missing = [v for v in choices if not re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", comment)]
            assert not missing, f"config.yaml's comment on {dotted} lacks {missing}: {comment!r}"
            checked += 1
    assert checked >= 10  # the parser found the commented choices


def test_a_partial_dict_takes_the_defaults():
    det = section(
        "detect",
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
    stage = load_stage_config({k: cfg[k] for k in ("data", "probe")}, ["data", "probe"])
    assert {k: to_dict(section(k, v)) for k, v in stage.items()} == {k: cfg[k] for k in ("data", "probe")}


# known exceptions: plain dicts inside the frozen grid section (its sweeps, axis -> values, its
# cells given whole, and resources.backbone_cost, backbone -> factor); a stage could change them in place
MUTABLE = {"grid": {"one_at_a_time", "product", "cells", "resources"}, "detect": {"protocols"}}


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


def test_each_method_that_trains_beside_moco_has_its_recipe_slot_in_grid():
    """grid.<method> comes from the registry: supervised, SimCLR and BYOL have one; MoCo (the
    base cell's recipe) and random init (trains nothing) have none."""
    grid = schema_properties("grid")["properties"]
    assert {"supervised", "simclr", "byol"} <= set(grid)
    assert not {"moco", "random"} & set(grid)
    typed = section("grid", {"byol": {"lr": 0.1}})
    assert typed.recipe({"method": "byol"}).lr == 0.1 and typed.recipe({"method": "simclr"}).lr is None
    assert typed.recipe({"method": "moco", "variant": "v2"}) is None and typed.recipe({"method": "random"}) is None


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


def test_the_printed_schema_validates_config_yaml_as_an_editor_would():
    """`python -m pipeline.dag.schema` prints the derived schema; a JSON Schema validator (an
    editor's) accepts config.yaml by it and names a bad value."""
    import json
    import sys

    import jsonschema
    from conftest import run

    schema = json.loads(run([sys.executable, "-m", "pipeline.dag.schema"]).stdout)
    assert schema["properties"]["pretrain"]["properties"]["method"]["enum"] == [
        "moco",
        "simclr",
        "byol",
        "supervised",
        "random",
    ]
    jsonschema.validate(load_yaml(DEFAULT_CONFIG), schema)
    bad = load_yaml(DEFAULT_CONFIG)
    bad["probe"]["mode"] = "streaming"
    with pytest.raises(jsonschema.ValidationError, match="'streaming' is not one of"):
        jsonschema.validate(bad, schema)
