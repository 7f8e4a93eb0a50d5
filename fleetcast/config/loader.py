"""Load a fleet config file once, validate it, and explain every problem at once.

Errors carry the YAML path of the field and, where the file has it, the line,
so `fleetcast config validate` can print them without a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from .model import FleetConfig
from .rules import ConfigIssue, check


class ConfigError(Exception):
    """The config file is unreadable or invalid; `issues` lists every problem found."""

    def __init__(self, source: str, issues: list[ConfigIssue], lines: dict[tuple, int] | None = None):
        self.source = source
        self.issues = issues
        self.lines = lines or {}
        super().__init__(self.render())

    def line_of(self, issue: ConfigIssue) -> int | None:
        path = tuple(issue.path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def render(self) -> str:
        out = [f"{self.source}: {len(self.issues)} problem(s)"]
        for issue in self.issues:
            line = self.line_of(issue)
            where = f"{issue.dotted} (line {line})" if line else issue.dotted
            out.append(f"  - {where}: {issue.message}")
        return "\n".join(out)


def _line_index(node: Any, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map every YAML path to its 1-based line, from ruamel's round-trip positions."""
    out = {} if out is None else out
    if isinstance(node, CommentedMap):
        for key in node:
            try:
                out[path + (key,)] = node.lc.key(key)[0] + 1
            except (KeyError, TypeError):
                pass
            _line_index(node[key], path + (key,), out)
    elif isinstance(node, CommentedSeq):
        for i, item in enumerate(node):
            try:
                out[path + (i,)] = node.lc.item(i)[0] + 1
            except (KeyError, TypeError, IndexError):
                pass
            _line_index(item, path + (i,), out)
    return out


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _pydantic_issues(exc: ValidationError) -> list[ConfigIssue]:
    issues = []
    for err in exc.errors(include_url=False):
        # Drop pydantic's union/tag segments (e.g. 'NewVpc', 'function-after[...]') from the path.
        path = tuple(p for p in err["loc"] if isinstance(p, int) or (isinstance(p, str) and "[" not in p and p[:1].islower()))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (typo?); it is not part of the config schema, see docs/config.md"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        elif err["type"] in ("enum", "literal_error"):
            msg = f"{msg}; got {err.get('input')!r}"
        elif err["type"] == "string_pattern_mismatch":
            msg = f"{err.get('input')!r} is malformed; must match {err['ctx']['pattern']}"
        issues.append(ConfigIssue(path, msg))
        if err["type"] == "too_short":
            issues[-1] = ConfigIssue(path, f"needs at least {err['ctx'].get('min_length')} item(s)")
    # A list whose items failed is also reported "too short": keep only the items' own errors.
    issues = [i for i in issues if not (i.message.startswith("needs at least") and any(
        o.path[: len(i.path)] == i.path and len(o.path) > len(i.path) for o in issues))]
    # A union (new vs existing VPC) reports each branch; keep one line per path+message.
    seen, unique = set(), []
    for issue in issues:
        if (issue.path, issue.message) not in seen:
            seen.add((issue.path, issue.message))
            unique.append(issue)
    return unique


def parse_config(data: dict[str, Any], source: str = "<config>", lines: dict[tuple, int] | None = None) -> FleetConfig:
    """Validate already-parsed data; raises ConfigError listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigIssue((), "the config must be a mapping at the top level")])
    try:
        cfg = FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _pydantic_issues(exc), lines) from None
    issues = check(cfg)
    if issues:
        raise ConfigError(source, issues, lines)
    return cfg


def load_config(path: str | Path) -> FleetConfig:
    """Read, parse and validate a fleet config file (YAML or JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [ConfigIssue((), f"cannot read the file: {exc.strerror}")]) from None
    yaml = YAML(typ="rt")
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(path), [ConfigIssue((), f"malformed YAML at {line}{exc.problem or exc}")]) from None
    if doc is None:
        raise ConfigError(str(path), [ConfigIssue((), "the file is empty")])
    return parse_config(_plain(doc), str(path), _line_index(doc))


def config_from_json(text: str) -> FleetConfig:
    """The form the stacks hand to instances (validated again there: same model, same rules)."""
    return parse_config(json.loads(text), "<delivered config>")


def json_schema() -> dict[str, Any]:
    return FleetConfig.model_json_schema(mode="validation")
