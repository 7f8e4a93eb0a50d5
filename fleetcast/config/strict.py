"""Scalars of the shape the field declares, not whatever pydantic's lax mode can coerce.

Lax mode reads `max_concurrency: true` as 1, `capacity: {max: "4"}` as 4, `min: 2.0` as 2 and
`api_keys: 1` as true. A YAML `true` in a number field is a mistake (a key written twice, a value
pasted in the wrong place), and a quoted number is text: refuse both with the field and what is
allowed, instead of deploying the coerced value. Enums, literals and strings keep their own checks.
"""

from __future__ import annotations

import types
import typing
from typing import Any


def _kinds(annotation: Any) -> set[Any]:
    """The scalar types an annotation accepts (Optional, unions and Annotated unwrapped; Literal values kept)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return {type(v) for v in typing.get_args(annotation)}
    return {annotation}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def scalar_problem(annotation: Any, value: Any) -> str | None:
    """Why `value` does not have the shape of `annotation`, or None. Looks one level into tuple[X, ...]."""
    if value is None:
        return None
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return scalar_problem(typing.get_args(annotation)[0], value)
    if origin is tuple and isinstance(value, (list, tuple)):
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            for item in value:
                problem = scalar_problem(args[0], item)
                if problem:
                    return problem
        return None
    kinds = _kinds(annotation)
    numbers = kinds & {int, float}
    if isinstance(value, bool):
        if bool not in kinds and numbers:
            return f"got {_show(value)}; this field is a number, not true/false"
        return None
    if bool in kinds and not (kinds - {bool, type(None)}) and not isinstance(value, bool):
        return f"got {_show(value)}; this field is true or false"
    if numbers and not kinds & {str} and isinstance(value, str):
        return f"got the text {value!r}; write the number without quotes"
    if int in kinds and float not in kinds and isinstance(value, float):
        return f"got {value!r}; this field is a whole number"
    return None
