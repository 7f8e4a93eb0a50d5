"""Model and adapter ids: what the config accepts, and the one slug every name derived from an id uses.

An id is what consumers send as the OpenAI `model` value. OpenAI-compatible servers take any string there;
users name models as the hub does (`Qwen/Qwen2.5-0.5B-Instruct`) or as OpenAI's fine-tunes are named
(`ft:gpt-3.5-turbo:acme::8abc1234`), so the id takes letters, digits and . _ - : / (no empty, `.` or `..`
path segment, at most MODEL_ID_MAX characters).

Where an id becomes part of a name, the name takes `model_slug(id)`, never the id:
- S3 keys (models/<slug>/<revision>/, adapters/<slug>/, the engine cache key): the S3 User Guide's "Naming
  Amazon S3 objects" lists as safe characters "0-9 a-z A-Z ! - _ . * ' ( )"; `/` would nest prefixes, so that
  model `a` at revision `b/...` and model `a/b` would share models/a/b/, and `:` "might require special
  handling".
- local paths on the instance (adapter directories, engine cache entries): one path segment each.
- CloudWatch alarm names (PutMetricAlarm AlarmName, 1-255 characters: botocore's cloudwatch model).
- environment values that list ids with `:` separators (the bench instance's FLEETCAST_BENCH_PACKING).
The slug keeps A-Za-z0-9 . _ - and writes every other character as `!` and two hex digits (`/` -> `!2f`,
`:` -> `!3a`): an id the old pattern took is its own slug (staged prefixes, engine keys and alarm names of
existing fleets stay the same), and the mapping is one-to-one (`!` is never left as is), so two ids never
share a name. The longest slug, MODEL_SLUG_MAX, fits one path segment (NAME_MAX 255).
CloudWatch dimension values (the `Model` dimension) keep the id itself: "Length Constraints: Minimum length of
1. Maximum length of 1024" (botocore's cloudwatch model, DimensionValue) and no character restriction, so the
dashboards and metrics name the model as consumers do.
"""

from __future__ import annotations

import re

MODEL_ID_MAX = 64
# The id's characters: starts with a letter or digit; letters, digits and . _ - : /.
MODEL_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:/-]{{0,{MODEL_ID_MAX - 1}}}$"
# What an id the old pattern (before slashes and colons) allowed: the characters a slug keeps.
SLUG_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
SLUG_ESCAPE = "!"
MODEL_SLUG_MAX = 3 * MODEL_ID_MAX


def model_id_problem(value: str) -> str | None:
    """Why `value` is not a model id, or None: the characters (MODEL_ID_PATTERN), then its `/` segments, none
    empty, `.` or `..` (a client would normalize /v1/models/a/../b, and `//` or a trailing `/` names nothing)."""
    if re.fullmatch(MODEL_ID_PATTERN, value, re.ASCII) is None:
        return (f"{value!r} is not a model id: 1-{MODEL_ID_MAX} of letters, digits and . _ - : /, starting with a "
                "letter or digit, e.g. gpt2-xl, Qwen/Qwen2.5-0.5B-Instruct or ft:gpt-3.5-turbo:acme::8abc1234")
    if any(part in ("", ".", "..") for part in value.split("/")):
        return f"{value!r} has an empty, '.' or '..' segment between slashes; allowed: org/name segments"
    return None


def is_model_id(value: str) -> bool:
    return model_id_problem(value) is None


def model_slug(model_id: str) -> str:
    """The id as one name segment of S3-safe characters (module docstring): unchanged for ids of A-Za-z0-9._-."""
    return "".join(ch if ch in SLUG_SAFE else f"{SLUG_ESCAPE}{ord(ch):02x}" for ch in model_id)


def model_id_of(slug: str) -> str:
    """model_slug's inverse: `Qwen!2fQwen2.5` -> `Qwen/Qwen2.5`; a plain id is returned as it is."""
    return re.sub(r"!([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), slug)
