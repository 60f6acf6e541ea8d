"""The config's JSON Schema, derived from the typed sections (pipeline.dag.sections): each key's
type from its annotation, its description and rules from its declaration, a nested section as
an object that takes no other key. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from pipeline.dag.sections import Config
from pipeline.methods import METHODS
from pipeline.methods.section import Pretrain

JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    dict: "object",
    tuple: "array",
    type(None): "null",
}
LIKE = {"pretrain": Pretrain}  # a key declared like_pretrain() takes that section's key's rules


def load_schema() -> dict:
    """The config's JSON schema, made once per process (every grid cell is validated against
    it while the DAG is built); callers must not modify it. Made anew once a method is
    registered: its pretrain.method enum is the method registry's names (pipeline.methods)."""
    return _schema(tuple(METHODS))


@functools.cache
def _schema(methods: tuple[str, ...]) -> dict:
    return config_schema()


def config_schema() -> dict:
    """The whole config's schema (a new dict each call: callers may change it)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "MoCo pipeline configuration",
        **section_schema(Config),
    }


def section_schema(cls: type) -> dict:
    hints = typing.get_type_hints(cls)
    properties = {f.name: key_schema(f, hints[f.name]) for f in dataclasses.fields(cls)}
    return {"type": "object", "additionalProperties": False, "properties": properties}


def key_schema(f: dataclasses.Field, hint: Any) -> dict:
    if "like" in f.metadata:
        base = LIKE[f.metadata["like"]]
        original = next(g for g in dataclasses.fields(base) if g.name == f.name)
        return nullable(key_schema(original, typing.get_type_hints(base)[f.name]))
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    nested = [k for k in kinds if isinstance(k, type) and dataclasses.is_dataclass(k)]
    schema = section_schema(nested[0]) if nested else {"type": json_types(kinds)}
    rules = {word: rule() if callable(rule) else rule for word, rule in f.metadata.get("rules", {}).items()}
    if "enum" in rules:  # the enum says it all (a key that may be null: null among its values, below)
        schema = {"enum": [v for v in rules.pop("enum") if v is not None]}
    if f.metadata.get("doc"):
        schema["description"] = f.metadata["doc"]
    schema = {**schema, **rules}
    return nullable(schema) if type(None) in kinds and not nested else schema


def json_types(kinds: tuple) -> str | list[str]:
    names = [JSON_TYPES[typing.get_origin(k) or k] for k in kinds]
    return names[0] if len(names) == 1 else names


def nullable(schema: dict) -> dict:
    """``schema`` taking null too: among an enum's values, or as one more type."""
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], *([None] if None not in schema["enum"] else [])]}
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return {**schema, "type": kinds if "null" in kinds else [*kinds, "null"]}


def main() -> None:
    """``python -m pipeline.dag.schema``: the schema as JSON (for an editor's YAML support)."""
    import json

    print(json.dumps(load_schema(), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
