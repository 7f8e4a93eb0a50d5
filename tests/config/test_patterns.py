"""Every pattern of the config model matches whole values in ASCII classes, as AWS does.

Two ways a pattern let through what AWS refuses (issue 25, section 4): `re.match(r"...$")` accepts a
trailing newline (Python's `$` also matches before a final "\\n"), and `\\d` / `\\w` match any Unicode
digit or letter (pydantic's regex engine and Python's `re` are both Unicode-aware). AWS ids, ARNs,
account numbers and region codes are ASCII. These tests walk every pattern instead of listing some:
the schema's `pattern`s (validated by pydantic's engine), the module-level patterns the validators use
(by Python's `re`), and the source of the config package for `re.match`/`re.search` calls.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import StringConstraints, TypeAdapter, ValidationError

import fleetcast.config as config_package
from fleetcast.config.loader import json_schema

from .conftest import problems

PACKAGE_DIR = Path(config_package.__file__).parent
# Non-ASCII look-alikes: ARABIC-INDIC DIGIT THREE for a digit, LATIN SMALL LETTER E WITH ACUTE for a letter.
UNICODE_DIGIT, UNICODE_LETTER = "\u0663", "\u00e9"


def _schema_patterns(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _schema_patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schema_patterns(value)


SCHEMA_PATTERNS = sorted(set(_schema_patterns(json_schema())))


def _module_patterns() -> list[tuple[str, re.Pattern]]:
    """Compiled patterns and *_PATTERN strings at module level in fleetcast.config.*, compiled as the
    validators use them (`full_match` compiles with re.ASCII)."""
    found = []
    for info in pkgutil.iter_modules(config_package.__path__):
        module = importlib.import_module(f"fleetcast.config.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                found.append((f"{info.name}.{name}", value))
            elif name.endswith("_PATTERN") and isinstance(value, str):
                found.append((f"{info.name}.{name}", re.compile(value, re.ASCII)))
    return found


# Patterns that search for one character rather than judge a whole value: YAML text may be any Unicode.
SEARCHES = {"loader._NOT_PRINTABLE"}
MODULE_PATTERNS = [(name, p) for name, p in _module_patterns() if name not in SEARCHES]


def test_the_walk_finds_the_patterns_it_is_meant_to_check():
    # A walk that found nothing would pass every test below.
    assert len(SCHEMA_PATTERNS) >= 15
    names = {name for name, _ in MODULE_PATTERNS}
    assert {"model.PRINCIPAL_ARN_PATTERN", "model.S3_URI_PATTERN", "rules._IMAGE_TAG", "model._CIDR"} <= names


@functools.cache
def _adapter(pattern: str) -> TypeAdapter:
    """One validator per pattern (built in 0.75 ms; each example asks it four times)."""
    return TypeAdapter(Annotated[str, StringConstraints(pattern=pattern)])


def _pydantic_accepts(pattern: str, value: str) -> bool:
    try:
        _adapter(pattern).validate_python(value)
    except ValidationError:
        return False
    return True


def _variants(value: str) -> list[str]:
    """What AWS refuses and a loose pattern accepts: the value with a trailing newline, and with its first
    ASCII digit or letter replaced by a non-ASCII one."""
    out = [value + "\n"]
    digit = re.search(r"[0-9]", value)
    if digit:
        out.append(value[:digit.start()] + UNICODE_DIGIT + value[digit.end():])
    letter = re.search(r"[A-Za-z]", value)
    if letter:
        out.append(value[:letter.start()] + UNICODE_LETTER + value[letter.end():])
    return out


# 15 values per pattern: the two defects are properties of the pattern (how it is anchored, which classes it
# uses), so any value it matches shows them, and a value with a digit and a letter shows all three variants;
# 40 cost 23 s of CPU a run, mostly generating values, for the same verdicts.
EXAMPLES = 15
# The values are drawn from ASCII characters, the values the tests are about (AWS's classes are ASCII; the variants
# add the non-ASCII look-alikes). Drawing from all of Unicode and filtering made Hypothesis build its table of every
# code point's category first (hypothesis/internal/charmap.py), 1.1 s of CPU in each process without the
# .hypothesis/unicode_data cache a previous run leaves: a clean clone's every worker.
ASCII = st.characters(codec="ascii")


@pytest.mark.parametrize("pattern", SCHEMA_PATTERNS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_schema_patterns_refuse_a_trailing_newline_and_non_ascii_look_alikes(pattern, data):
    value = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True, alphabet=ASCII))
    assert _pydantic_accepts(pattern, value), value
    for variant in _variants(value):
        assert not _pydantic_accepts(pattern, variant), f"{pattern} accepts {variant!r}"


@pytest.mark.parametrize("name,pattern", MODULE_PATTERNS, ids=[n for n, _ in MODULE_PATTERNS])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_validator_patterns_match_whole_ascii_values(name, pattern, data):
    assert pattern.flags & re.ASCII, f"{name} is compiled without re.ASCII: \\d and \\w would match non-ASCII"
    value = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=ASCII))
    for variant in _variants(value):
        assert not pattern.fullmatch(variant), f"{name} accepts {variant!r}"


def _regex_calls() -> Iterator[tuple[str, int, str, ast.Call]]:
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re":
                yield path.name, node.lineno, node.func.attr, node


def test_validators_match_whole_values_in_ascii_classes():
    """No `re.match`/`re.search` judges a whole value, and every regex call names re.ASCII."""
    found = list(_regex_calls())
    assert found, "the walk saw no regex call"
    loose = [f"{f}:{line} re.{attr}" for f, line, attr, call in found if attr in ("match", "search")
             and isinstance(call.args[0], (ast.Constant, ast.JoinedStr))
             and ast.unparse(call.args[0]).rstrip("'\"").endswith("$")]
    assert not loose, f"anchored with $ (a trailing newline passes): {loose}"
    unicode_classes = [f"{f}:{line}" for f, line, attr, call in found
                       if attr in ("match", "search", "fullmatch", "compile")
                       and "re.ASCII" not in ast.unparse(call) and re.search(r"\\[dwsDWS]", ast.unparse(call.args[0]))]
    assert not unicode_classes, f"\\d \\w \\s without re.ASCII: {unicode_classes}"


# The classes the issue names, through the whole loader: each value was accepted before.
@pytest.mark.parametrize("where,value", [
    (("regions", 0, "allowed_principals", 0), "arn:aws:iam::444455556666:root\n"),
    (("provider", "account"), "\u0661\u0661\u0661\u0661\u0662\u0662\u0662\u0662\u0663\u0663\u0663\u0663"),
    (("regions", 0, "availability_zones", 0, "id"), "apne2-az\u0661"),
    (("model", "source"), "openai-community/gpt2-xl\n"),
    (("engine", "image"), "nvcr.io/nvidia/tensorrt-llm/release:1.2.1\n"),
    (("regions", 0, "region"), "ap-northeast-\u0662"),
])
def test_the_reported_mistakes_are_refused_naming_the_field(doc, where, value):
    node = doc
    for key in where[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[where[-1]] = value
    found = problems(doc)
    dotted = ".".join(str(k) for k in where if isinstance(k, str))
    assert found, f"{value!r} was accepted"
    assert any(where[0] in line for line in found), (dotted, found)


def test_a_certificate_arn_with_a_trailing_newline_is_refused(doc):
    region = doc["regions"][0]["region"]
    doc.setdefault("network", {})["tls_certificate_arns"] = {
        region: f"arn:aws:acm:{region}:350093174826:certificate/0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9\n"}
    assert any(line.startswith("network.tls_certificate_arns") for line in problems(doc))
