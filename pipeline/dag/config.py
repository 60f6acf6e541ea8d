"""One config, validated once: the JSON schema (pipeline.dag.schema, derived from the typed
sections) plus the cross-field rules it cannot express.

Two ways in: ``load_config`` (the whole workflow config, validated and typed: the Snakefile,
plan, tables, claims) and ``load_stage_config`` (the sections a stage was given, validated);
``section`` types one of them.

The Snakefile validates the whole config at DAG build; each stage validates the sections it
was given when run by hand. Errors name the key, the value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

import jsonschema
import yaml

from pipeline import REPO
from pipeline.base.errors import ConfigError
from pipeline.base.keys import INIT, PLAN, RUNTIME
from pipeline.base.layout import MAIN_PROTOCOL
from pipeline.dag import training_set
from pipeline.dag.recipes import base_with_recipe
from pipeline.dag.schema import load_schema
from pipeline.dag.sections import Claims, Config, Convert, Data, Dataset, Detect, Grid, Launch, Probe
from pipeline.methods import method_spec
from pipeline.methods.section import Pretrain

DEFAULT_CONFIG = REPO / "workflow" / "config" / "config.yaml"


# --- typed sections (pipeline.dag.sections) ------------------------------------------------------
SECTION_TYPES = {
    "dataset": Dataset,
    "convert": Convert,
    "data": Data,
    "pretrain": Pretrain,
    "grid": Grid,
    "claims": Claims,
    "probe": Probe,
    "detect": Detect,
    "launch": Launch,
}
S = TypeVar("S")  # a section's dataclass


def _build(cls: type[S], values: dict | None = None) -> S:
    """The typed section ``cls`` from a validated dict: missing keys take the dataclass
    defaults, nested sections become nested dataclasses and lists tuples."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # S is a dataclass
    values = values or {}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in a {cls.__name__} section (known: {sorted(fields)})")
    return cls(**{key: _typed_value(fields[key], value) for key, value in values.items()})


def _typed_value(f: dataclasses.Field, value):
    factory = f.default_factory
    # a nested section's factory is its class, or the class with other defaults (functools.partial)
    nested = factory.func if isinstance(factory, functools.partial) else factory
    if dataclasses.is_dataclass(nested) and isinstance(value, dict):
        defaults = factory.keywords if isinstance(factory, functools.partial) else {}
        return _build(cast(type, nested), {**defaults, **value})
    return tuple(value) if isinstance(value, list) else value


# typed per name for the sections the stages read, so that a checker sees what each one holds
@overload
def section(name: Literal["pretrain"], values: dict | None = None) -> Pretrain: ...
@overload
def section(name: Literal["data"], values: dict | None = None) -> Data: ...
@overload
def section(name: Literal["convert"], values: dict | None = None) -> Convert: ...
@overload
def section(name: Literal["grid"], values: dict | None = None) -> Grid: ...
@overload
def section(name: Literal["claims"], values: dict | None = None) -> Claims: ...
@overload
def section(name: Literal["probe"], values: dict | None = None) -> Probe: ...
@overload
def section(name: Literal["detect"], values: dict | None = None) -> Detect: ...
@overload
def section(name: Literal["launch"], values: dict | None = None) -> Launch: ...
@overload
def section(name: Literal["dataset"], values: dict | None = None) -> Dataset: ...
@overload
def section(name: str, values: dict | None = None) -> Any: ...
def section(name: str, values: dict | None = None) -> Any:
    """The typed config section ``name`` (a key of SECTION_TYPES) from its validated dict."""
    return _build(SECTION_TYPES[name], values)


def _typed_config(cfg: dict) -> Config:
    """The whole (validated) workflow config typed: absent sections and keys at their defaults,
    as every stage reads them; ``claims`` stays None when the config has none."""
    typed = _build(Config, {name: values for name, values in cfg.items() if name != "claims"})
    return typed if "claims" not in cfg else dataclasses.replace(typed, claims=section("claims", cfg["claims"]))


def to_dict(typed) -> dict:
    """A typed section back as the dict the config holds (tuples as lists, as YAML/JSON read them)."""
    return _as_lists(dataclasses.asdict(typed))


def _as_lists(value):
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


def result_part(name: str, values: dict, drop: tuple[str, ...] = (RUNTIME,), untrained: bool = False) -> dict:
    """Section ``name``'s keys that determine its stage's result (pipeline.dag.sections: a field's
    "sets"): all but the RUNTIME keys (and the kinds in ``drop``) and the PLAN keys (what they
    set is in the section); of a pretraining that trains nothing (the random-init baseline,
    ``untrained``), only the INIT keys."""
    typed = section(name, values)

    def kept(f: dataclasses.Field) -> bool:
        sets, unless = f.metadata.get("sets"), f.metadata.get("unless")
        if sets == PLAN:
            return False
        if untrained:
            return sets == INIT
        return sets not in drop or (unless is not None and unless(typed))

    return {f.name: values[f.name] for f in dataclasses.fields(typed) if f.name in values and kept(f)}


def result_config(sections: dict, drop: tuple[str, ...] = (RUNTIME,)) -> dict:
    """result_part of each typed section of a stage's config (name -> validated dict)."""
    method = sections.get("pretrain", {}).get("method", Pretrain.method)
    untrained = not method_spec(method).trains
    return {
        name: result_part(name, values, drop, untrained) if name in SECTION_TYPES else values
        for name, values in sections.items()
    }


def pretrain_cell(base: Pretrain, override: dict, where: str = "pretrain", num_samples: int | None = None) -> Pretrain:
    """One grid cell: the base cell with ``override``'s values, validated as a pretrain section
    (schema and cross-field rules)."""
    fields = {f.name: f for f in dataclasses.fields(Pretrain)}
    unknown = sorted(set(override) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown pretrain key(s) {unknown}")
    cell = dataclasses.replace(base, **{k: _typed_value(fields[k], v) for k, v in override.items()})
    validate_schema(to_dict(cell), load_schema()["properties"]["pretrain"], prefix=where)
    check_pretrain(cell, where=where, num_samples=num_samples)
    return cell


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return yaml.safe_load(path.read_text()) or {}


def merge(base: dict, override: dict) -> dict:
    """Deep merge: dicts merge key by key, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _schema_error(err: jsonschema.ValidationError, prefix: str = "") -> ConfigError:
    # anyOf [a list of values, null] (e.g. grid.supervised's keys): name the values allowed
    err = next((e for e in err.context or () if e.validator == "enum"), err)
    key = ".".join(str(p) for p in err.absolute_path)
    key = f"{prefix}{'.' if prefix and key else ''}{key}" or "<root>"
    schema = err.schema if isinstance(err.schema, dict) else {}
    allowed = []
    for word in ("enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern", "type"):
        if word in schema:
            allowed.append(f"{word}={schema[word]}")
    hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
    return ConfigError(f"config key '{key}': {err.message}{hint}")


# "integer" means an int: JSON Schema would take 10.0 or 1e12 written as a float
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool)
    ),
)


def validate_schema(instance: dict, schema: dict, prefix: str = "") -> None:
    errors = sorted(_Validator(schema).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        raise _schema_error(errors[0], prefix)
    for path, value in _non_finite(instance):
        key = ".".join([prefix] * bool(prefix) + [str(k) for k in path])
        raise ConfigError(
            f"config key '{key}': {value} is not a finite number (a range check cannot catch .inf or .nan)"
        )


def _non_finite(value, path=()):
    """(path, value) of every float that is inf or nan (YAML's .inf / .nan)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _non_finite(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _non_finite(v, (*path, i))


def check_pretrain(p: Pretrain, where: str = "pretrain", num_samples: int | None = None) -> None:
    """Cross-field rules of one pretraining cell."""
    drops = list(p.lr_step_epochs or [])
    if drops != sorted(set(drops)) or (drops and drops[-1] >= p.epochs):
        raise ConfigError(f"{where}: lr_step_epochs={drops} must increase and stay below epochs={p.epochs}")
    if p.spec.check is not None:
        p.spec.check(p, where, num_samples)


def pretrain_warnings(p: Pretrain, num_samples: int | None) -> list[str]:
    """Settings that run but are probably not meant (the stage logs them)."""
    if p.has_queue and num_samples and p.K >= num_samples and not p.mask_same_source:
        return [
            f"K={p.K} >= {num_samples} training images: the queue holds keys of the query's own image "
            "as negatives; lower K or set mask_same_source: true"
        ]
    return []


def check_dataset_source(d: Dataset) -> None:
    if d.source != "synthetic" and d.root is None:
        raise ConfigError(f"dataset.root: required for dataset.source '{d.source}' (every source but 'synthetic')")


def check_dataset(d: Dataset) -> None:
    if d.source != "synthetic" and not Path(str(d.root)).expanduser().is_dir():
        raise ConfigError(f"dataset.root: folder not found: {d.root}")


def check_detect(det: Detect, dataset: Dataset, folders: bool = True) -> None:
    if not det.enabled:
        return
    if det.root is None and dataset.source != "synthetic":
        raise ConfigError(
            "detect.root: required (a COCO folder or a VOCdevkit) unless dataset.source is "
            "'synthetic', or set detect.enabled: false"
        )
    if folders:
        check_detect_root(det)
    check_detector(det)
    check_protocols(det)


# what every protocol of detect.protocols shares with the main one: the cells, the trials
PROTOCOL_SHARED = ("enabled", "cells", "trials", "protocols")


def detect_protocol(detect: dict, name: str) -> dict:
    """The detect section of protocol ``name`` (detect.protocols): its keys over ``detect``'s."""
    return merge({k: v for k, v in detect.items() if k != "protocols"}, detect["protocols"][name])


def check_protocols(det: Detect) -> None:
    """Each of detect.protocols: valid detect keys, none of those it shares with the main protocol."""
    for name, keys in det.protocols.items():
        where = f"detect.protocols.{name}"
        if name == MAIN_PROTOCOL:
            raise ConfigError(f"{where}: {MAIN_PROTOCOL!r} names detect's own protocol in the tables; choose another")
        shared = sorted(set(keys) & set(PROTOCOL_SHARED))
        if shared:
            raise ConfigError(f"{where}: {', '.join(shared)} cannot differ between protocols (the main one's apply)")
        values = detect_protocol(to_dict(det), name)
        validate_schema(values, load_schema()["properties"]["detect"], prefix=where)
        try:
            check_detector(section("detect", values))
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None


def check_detect_root(det: Detect) -> None:
    if det.root is not None and not Path(det.root).expanduser().is_dir():
        raise ConfigError(f"detect.root: folder not found: {det.root}")


VOC_HAS_NO_MASKS = (
    "detect.task: segmentation needs instance masks, and Pascal VOC's detection annotations have none: "
    "use task detection on VOC, or a COCO-format root whose instances json has 'segmentation'"
)


def check_detector(det: Detect) -> None:
    if det.max_image_size and det.max_image_size < det.image_size:
        raise ConfigError(f"detect.max_image_size={det.max_image_size} is below detect.image_size={det.image_size}")
    if det.batch_size % det.ranks:
        raise ConfigError(f"detect.batch_size={det.batch_size} is not a multiple of detect.ranks={det.ranks}")
    if det.schedule == "step" and not det.lr_steps:
        raise ConfigError("detect.lr_steps: the step schedule needs the iterations at which the lr drops")
    steps = list(det.lr_steps or [])
    if steps != sorted(steps):
        raise ConfigError(f"detect.lr_steps={steps} must be in increasing order")
    if det.iterations and steps and steps[-1] >= det.iterations:
        raise ConfigError(f"detect.lr_steps={steps} reach beyond detect.iterations={det.iterations}")
    cap = det.max_image_size or det.image_size
    train_sizes = list(det.train_sizes or [])
    if any(s > cap for s in train_sizes):
        raise ConfigError(
            f"detect.train_sizes={train_sizes} exceed the longer side's cap {cap} (detect.max_image_size)"
        )
    if det.task == "segmentation" and det.dataset == "voc":
        raise ConfigError(VOC_HAS_NO_MASKS)
    if det.anchor_sizes and det.head == "fpn" and len(det.anchor_sizes) != 5:
        raise ConfigError(
            f"detect.anchor_sizes: the FPN head needs one size per pyramid level (5), not {len(det.anchor_sizes)}"
        )


_NULLS = ("null", "Null", "NULL", "~", "")


def read_command_line_values(cfg: dict, schema: dict | None = None) -> dict:
    """Snakemake hands the leaves of a nested ``--config`` value over as strings
    (``pretrain='{epochs: 50}'`` gives ``'50'``, ``null`` gives ``'null'``). Read every string
    where the schema expects no string as a YAML scalar, as a config file would have it; the
    schema then validates the result as usual. Changes ``cfg`` in place and returns it."""
    schema = schema or load_schema()

    def read(value, node):
        node = node or {}
        if isinstance(value, dict):
            props, extra = node.get("properties", {}), node.get("additionalProperties")
            for k in value:
                value[k] = read(value[k], props.get(k, extra if isinstance(extra, dict) else None))
            return value
        if isinstance(value, list):
            return [read(v, node.get("items")) for v in value]
        if not isinstance(value, str):
            return value
        kinds = node.get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if "string" in kinds or "enum" in node:
            nullable = "null" in kinds or None in node.get("enum", ())
            return None if nullable and value in _NULLS else value
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return parsed if parsed is None or isinstance(parsed, (bool, int, float)) else value

    return read(cfg, schema)


def check_probe(pc: Probe) -> None:
    if pc.ranks > 1 and pc.mode != "augmented":
        raise ConfigError(
            f"probe.ranks={pc.ranks} needs probe.mode: augmented (the cached probe trains on "
            "features extracted once: one process is all it needs)"
        )
    if pc.batch_size and pc.batch_size % pc.ranks:
        raise ConfigError(f"probe.batch_size={pc.batch_size} is not a multiple of probe.ranks={pc.ranks}")


def check_claims(claims: Claims) -> None:
    if claims.long_epochs <= claims.epochs:
        raise ConfigError(
            f"claims.long_epochs={claims.long_epochs} must exceed claims.epochs={claims.epochs} "
            "(the claim compares a longer schedule with a shorter one)"
        )


def load_config(cfg: dict, folders: bool = False) -> Config:
    """A whole workflow config (a dict, as YAML and Snakemake give it), validated and typed once:
    the schema, the cross-field rules, then the base cell's least length (``pretrain.min_steps``:
    ``cfg``'s epochs are raised with it). ``folders``: that dataset.root and detect.root exist
    too (off: the jobs that read them check them, so that `snakemake plan` runs before the data
    is staged)."""
    validate_schema(cfg, load_schema())
    typed = _with_base_recipe(_typed_config(cfg), cfg)
    check_dataset_source(typed.dataset)
    if folders:
        check_dataset(typed.dataset)
    check_detect(typed.detect, typed.dataset, folders)
    check_pretrain(typed.pretrain)
    check_probe(typed.probe)
    if typed.claims is not None:
        check_claims(typed.claims)
    # after the checks, which judge the config as written (raising epochs keeps them true)
    return training_set.lengthen_base(typed, cfg)  # pretrain.min_steps (updates cfg to agree)


def _with_base_recipe(typed: Config, stated: dict) -> Config:
    """``typed`` with the base cell's recipe where the config switches its method, variant or
    backbone (pipeline.dag.recipes.base_with_recipe); ``stated``, the config as given, is
    updated to agree: the jobs' JSON holds what they train."""
    recipe = base_with_recipe(typed.pretrain, typed.grid)
    if not recipe:
        return typed
    stated["pretrain"] = {**stated.get("pretrain", {}), **recipe}  # a new dict: the caller's stays
    return dataclasses.replace(typed, pretrain=pretrain_cell(typed.pretrain, recipe))


def load_stage_config(source: str | dict, sections: list[str]) -> dict:
    """The named sections of a stage's config, validated (what a stage run by hand, or a rule,
    gave it): ``source`` is inline JSON, a YAML/JSON file path (its other sections dropped) or
    a dict. Returns them as dicts (their keys as stated: a stage's result fingerprint);
    ``section`` types each one."""
    if isinstance(source, dict):
        cfg = source
    else:
        text = source.strip()
        cfg = json.loads(text) if text.startswith("{") else load_yaml(text)
        if Path(text).suffix in (".yaml", ".yml") and set(cfg) - set(sections):
            cfg = {k: cfg[k] for k in sections if k in cfg}
    schema = load_schema()
    for name in sections:
        if name not in cfg:
            raise ConfigError(f"config section '{name}' is missing")
        validate_schema(cfg[name], schema["properties"][name], prefix=name)
    if "dataset" in sections:
        check_dataset_source(section("dataset", cfg["dataset"]))
    if "pretrain" in sections:
        check_pretrain(section("pretrain", cfg["pretrain"]))
    if "detect" in sections:
        check_detector(section("detect", cfg["detect"]))
    if "probe" in sections:
        check_probe(section("probe", cfg["probe"]))
    return cfg
