"""Load a fleet config file once, validate it, and explain every problem at once.

Errors carry the YAML path of the field and, where the file has it, the line,
so `fleetcast config validate` can print them without a traceback.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import ConstructorError, RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import PREFIX as ENV_PREFIX

from .model import FieldProblem, FleetConfig
from .parameter import decode_parameter
from .rules import ConfigIssue, check

# Bounds on what the validator reads, so any input ends in one clear error in bounded time.
# The shipped config is ~4 KB, 17 levels deep at most... (see tests/config/test_input_bounds.py);
# these leave two orders of magnitude of headroom.
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 32          # mappings/lists nested inside each other
MAX_ENTRIES = 20_000    # keys and list items in the whole document, aliases expanded
MAX_INT_DIGITS = 24     # every integer field fits in 20 digits; Python refuses to parse >4300
MAX_ISSUES = 100        # problems listed; the rest are counted


class ConfigError(UserError):
    """The config file is unreadable or invalid; `issues` lists every problem found (exit 1)."""

    def __init__(self, source: str, issues: list[ConfigIssue], lines: dict[tuple[Any, ...], int] | None = None):
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
        for issue in self.issues[:MAX_ISSUES]:
            line = self.line_of(issue)
            where = f"{issue.dotted} (line {line})" if line else issue.dotted
            out.append(f"  - {where}: {issue.message}")
        if len(self.issues) > MAX_ISSUES:
            out.append(f"  ... and {len(self.issues) - MAX_ISSUES} more (the first {MAX_ISSUES} are listed)")
        return "\n".join(out)


class _TooLarge(Exception):
    def __init__(self, message: str, path: tuple[Any, ...]):
        super().__init__(message)
        self.path = path


class _BadKey(Exception):
    def __init__(self, message: str, path: tuple[Any, ...], line: int | None):
        super().__init__(message)
        self.path, self.line = path, line


def _key_problem(key: Any) -> str:
    """Every key of a fleet config is text (field names, tag keys, model ids, region names). YAML reads an unquoted
    true/false, number or ~ key as a boolean, number or null (YAML 1.2 core schema; under a `%YAML 1.1` directive
    also yes/no/on/off), and str() of it would turn `true` into a tag `True`: the key is refused, not rewritten."""
    if isinstance(key, bool):
        shown = "true" if key else "false"
        what = (f"the boolean {shown} (written {shown}, or {'yes/on' if key else 'no/off'} under a %YAML 1.1 "
                "directive)")
    elif key is None:
        shown, what = "null", "null (written ~, null or nothing)"
    else:
        shown, what = str(key), f"the {'number' if isinstance(key, (int, float)) else type(key).__name__} {key}"
    return f"a key YAML reads as {what}, not as text; allowed: a text key: quote it as written, e.g. '{shown}': ..."


def _walk(doc: Any) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """Plain dicts/lists of the round-trip document and the 1-based line of every path.

    Bounded: at most MAX_DEPTH levels and MAX_ENTRIES entries, counting aliases as the copies
    they stand for (a recursive or exponential alias is refused here, not expanded).
    """
    lines: dict[tuple[Any, ...], int] = {}
    budget = [MAX_ENTRIES]

    def visit(node: Any, path: tuple[Any, ...]) -> Any:
        if len(path) > MAX_DEPTH:
            raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep (a fleet config needs fewer than 10)", path[:MAX_DEPTH])
        if isinstance(node, dict):
            budget[0] -= len(node)
            if budget[0] < 0:
                raise _TooLarge(f"more than {MAX_ENTRIES} keys and list items in the document; a fleet config has "
                                "a few hundred", path)
            out = {}
            for key in node:
                if not isinstance(key, str):
                    line = None
                    if isinstance(node, CommentedMap):
                        try:
                            line = node.lc.key(key)[0] + 1
                        except (KeyError, TypeError):
                            pass
                    raise _BadKey(_key_problem(key), path, line)
                here = path + (key,)
                if isinstance(node, CommentedMap):
                    try:
                        lines[here] = node.lc.key(key)[0] + 1
                    except (KeyError, TypeError):
                        pass
                out[str(key)] = visit(node[key], here)
            return out
        if isinstance(node, list):
            budget[0] -= len(node)
            if budget[0] < 0:
                raise _TooLarge(f"more than {MAX_ENTRIES} keys and list items in the document; a fleet config has "
                                "a few hundred", path)
            out_list = []
            for i, item in enumerate(node):
                if isinstance(node, CommentedSeq):
                    try:
                        lines[path + (i,)] = node.lc.item(i)[0] + 1
                    except (KeyError, TypeError, IndexError):
                        pass
                out_list.append(visit(item, path + (i,)))
            return out_list
        return node

    return visit(doc, ()), lines


def _line_index(node: Any) -> dict[tuple[Any, ...], int]:
    """Map every YAML path to its 1-based line, from ruamel's round-trip positions."""
    return _walk(node)[1]


def _plain(node: Any) -> Any:
    return _walk(node)[0]


# ---------------------------------------------------------------- pydantic errors -> issues


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _members(tp: Any) -> list[Any]:
    """The alternatives of a union (Optional included), each unwrapped; [tp] for anything else."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _resolve(loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], type[BaseModel] | None]:
    """The YAML path of a pydantic error location, and the model that holds its last key.

    Pydantic puts the branch of a union in the location ('NewVpc', 'new', "literal['latest']");
    those segments are dropped by walking the schema, so a key such as `Tags` stays in the path.
    """
    path: list[Any] = []
    current: Any = FleetConfig
    parent: type[BaseModel] | None = None
    for seg in loc:
        options = _members(_unwrap(current))
        models = [m for m in options if isinstance(m, type) and issubclass(m, BaseModel)]
        if len(options) > 1 and isinstance(seg, str):
            branch = next((m for m in models if seg in (m.__name__, _tag_of(m))), None)
            if branch is not None or not any(seg in m.model_fields for m in models):
                current = branch if branch is not None else None
                continue  # a union-branch segment, not part of the document
        if models:
            model = next((m for m in models if isinstance(seg, str) and seg in m.model_fields), models[0])
            parent = model
            path.append(seg)
            field = model.model_fields.get(seg) if isinstance(seg, str) else None
            current = field.annotation if field is not None else None
            continue
        origin = typing.get_origin(_unwrap(current))
        args = typing.get_args(_unwrap(current))
        if origin is tuple and args:
            path.append(seg)
            current = args[0]
        elif origin is dict and args:
            path.append(seg)
            current = args[1]
        elif isinstance(seg, int) or current is None:
            path.append(seg)
        # else: a segment naming a constrained type inside a scalar's union ('constrained-str'): dropped
    return tuple(path), parent


def _tag_of(model: type) -> str | None:
    return getattr(model, "union_tag", None)


def _unknown_key_message(key: str, model: type[BaseModel] | None) -> str:
    known = sorted(model.model_fields) if model is not None else []
    match = next((k for k in known if k == key.lower().strip("_")), None)
    if match is None and known:
        close = difflib.get_close_matches(key.lower().strip("_"), known, n=1, cutoff=0.6)
        match = close[0] if close else None
    msg = f"unknown key {key!r}"
    if match:
        msg += f"; did you mean {match!r}? (keys are lower-case snake_case)"
    elif key.startswith("_"):
        msg += "; underscore keys are not comments here: use a YAML comment (# ...)"
    if known:
        msg += f"; allowed here: {', '.join(known)}"
    return msg


def _pydantic_issues(exc: ValidationError) -> list[ConfigIssue]:
    issues = []
    errors = exc.errors(include_url=False)
    for err in errors[: MAX_ISSUES * 4]:
        path, model = _resolve(tuple(err["loc"]))
        blamed = (err.get("ctx") or {}).get("error")
        if isinstance(blamed, FieldProblem):
            path += blamed.field  # a model validator names the field it refuses
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = _unknown_key_message(str(path[-1]) if path else "?", model)
        elif err["type"] == "missing":
            msg = "required field is missing" + _what_it_takes(model, path)
        elif err["type"] == "string_type" and isinstance(err.get("input"), (int, float)) and not isinstance(err.get("input"), bool):
            if path and path[-1] == "account":
                msg = (f"got the number {err['input']}: quote it: account ids are strings of 12 digits, "
                       'e.g. account: "111122223333" (unquoted, YAML reads a number and drops leading zeros)')
            else:
                msg = f"got the number {err['input']}; this field is text: quote it, e.g. \"{err['input']}\""
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        elif err["type"] in ("enum", "literal_error"):
            msg = f"{msg}; got {_short(err.get('input'))}"
        elif err["type"] == "string_pattern_mismatch":
            msg = f"{_short(err.get('input'))} is malformed; must match {err['ctx']['pattern']}"
        elif err["type"] == "finite_number":
            msg = f"got {err.get('input')!r}; a finite number is required"
        elif err["type"] in _BOUND_WORDS:
            msg = f"got {_short(err.get('input'))}; allowed: {_bounds(model, path, err)}"
        issues.append(ConfigIssue(path, msg))
        if err["type"] == "too_short":
            given = err.get("input")
            count = "an empty list; " if isinstance(given, (list, tuple, dict)) and not given else ""
            issues[-1] = ConfigIssue(path, f"{count}needs at least {err['ctx'].get('min_length')} item(s)"
                                           + _entry_keys(model, path))
    issues = _merge_scalar_unions(issues, errors[: MAX_ISSUES * 4])
    # A list whose items failed is also reported "too short": keep only the items' own errors.
    deeper = {i.path[:n] for i in issues for n in range(len(i.path))}
    issues = [i for i in issues if not ("needs at least" in i.message and i.path in deeper)]
    # A scalar union (ami-... or 'latest') reports each branch: keep them, one line per path+message.
    seen, unique = set(), []
    for issue in issues:
        if (issue.path, issue.message) not in seen:
            seen.add((issue.path, issue.message))
            unique.append(issue)
    if len(errors) > MAX_ISSUES * 4:
        unique.append(ConfigIssue((), f"{len(errors) - MAX_ISSUES * 4} further schema errors not examined"))
    return unique


# Pydantic's numeric bound errors ("Input should be greater than 0"), said as the range the field takes.
_BOUND_WORDS = {"greater_than": "above", "greater_than_equal": "at least", "less_than": "below",
                "less_than_equal": "at most"}


def _field(model: type[BaseModel] | None, path: tuple[Any, ...]) -> Any:
    name = next((p for p in reversed(path) if isinstance(p, str)), None)
    return model.model_fields.get(name) if model is not None and name is not None else None


def _bounds(model: type[BaseModel] | None, path: tuple[Any, ...], err: ErrorDetails) -> str:
    """Every bound of the field ("above 0 and at most 4096"), or the one pydantic reported."""
    import annotated_types

    field = _field(model, path)
    words = {annotated_types.Gt: ("above", "gt"), annotated_types.Ge: ("at least", "ge"),
             annotated_types.Lt: ("below", "lt"), annotated_types.Le: ("at most", "le")}
    found = [f"{words[type(m)][0]} {getattr(m, words[type(m)][1])}" for m in (field.metadata if field else ())
             if type(m) in words]
    if not found:
        limit = next(iter((err.get("ctx") or {}).values()), "?")
        found = [f"{_BOUND_WORDS[err['type']]} {limit}"]
    return " and ".join(found)


def _what_it_takes(model: type[BaseModel] | None, path: tuple[Any, ...]) -> str:
    """What a missing field takes: its description's first sentence, and the keys an entry of a list needs."""
    field = _field(model, path)
    keys = _entry_keys(model, path)
    keys = f"; a list of entries{keys}" if keys else ""
    if field is None or not field.description:
        return keys
    return f": {field.description.split('. ')[0].rstrip('.')}" + keys


def _entry_keys(model: type[BaseModel] | None, path: tuple[Any, ...]) -> str:
    """For a list of models: the keys each entry needs."""
    field = _field(model, path)
    item = typing.get_args(_unwrap(field.annotation)) if field is not None else ()
    entry = _unwrap(item[0]) if item else None
    if isinstance(entry, type) and issubclass(entry, BaseModel):
        required = [k for k, f in entry.model_fields.items() if f.is_required()]
        return f", each with {', '.join(required)}" if required else ""
    return ""


def _merge_scalar_unions(issues: list[ConfigIssue], errors: list[ErrorDetails]) -> list[ConfigIssue]:
    """A value refused by every branch of a scalar union (`ami-...` or `latest`) is one issue naming each form."""
    forms: dict[tuple[Any, ...], list[str]] = {}
    for issue, err in zip(issues, errors):
        if len(err["loc"]) > len(issue.path) and isinstance(err["loc"][-1], str) and err["loc"][-1] not in issue.path:
            if err["type"] == "string_pattern_mismatch":
                forms.setdefault(issue.path, []).append(f"match {err['ctx']['pattern']}")
            elif err["type"] == "literal_error":
                forms.setdefault(issue.path, []).append(f"be {err['ctx']['expected']}")
    merged = {path: parts for path, parts in forms.items() if len(parts) > 1}
    out, done = [], set()
    for issue, err in zip(issues, errors):
        if issue.path not in merged:
            out.append(issue)
        elif issue.path not in done:
            done.add(issue.path)
            out.append(ConfigIssue(issue.path, f"{_short(err.get('input'))} is not allowed; it must "
                                               f"{' or '.join(merged[issue.path])}"))
    return out + issues[len(errors):]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


def parse_config(data: dict[str, Any], source: str = "<config>", lines: dict[tuple[Any, ...], int] | None = None) -> FleetConfig:
    """Validate already-parsed data; raises ConfigError listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigIssue((), "the config must be a mapping at the top level")])
    single = "model" in data and "models" not in data
    try:
        cfg = FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _in_written_form(_pydantic_issues(exc), single), lines) from None
    issues = check(cfg)
    if issues:
        raise ConfigError(source, _in_written_form(issues, single), lines)
    return cfg


def _in_written_form(issues: list[ConfigIssue], single: bool) -> list[ConfigIssue]:
    """Issues of a config written in the single-model form name its paths (model.x, calibration.x), not the
    one-model list it was read as (models[0].x)."""
    return [ConfigIssue(single_form_path(i.path), i.message) for i in issues] if single else issues


# ---------------------------------------------------------------- reading the file

# YAML 1.2 "printable" characters (c-printable); anything else is refused by the parser.
_NOT_PRINTABLE = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_BOMS = {b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe\x00\x00": "UTF-32", b"\xfe\xff": "UTF-16", b"\xff\xfe": "UTF-16"}


def _where(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def _decode(raw: bytes) -> str:
    """The file's text, or a ValueError saying which byte or character is wrong and where."""
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"the file is {len(raw)} bytes; a fleet config is at most {MAX_FILE_BYTES} bytes "
                         "(the shipped one is about 4 KB)")
    for bom, encoding in _BOMS.items():
        if raw.startswith(bom):
            raise ValueError(f"the file is encoded as {encoding}; save it as UTF-8")
    if raw.count(b"\x00") > len(raw) // 4 > 0:
        raise ValueError("the file looks like UTF-16 or binary data (many NUL bytes); a config is UTF-8 text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        partial = raw[: exc.start].decode("utf-8", errors="replace")
        raise ValueError(f"{_where(partial, len(partial))}: byte 0x{raw[exc.start]:02x} is not UTF-8; save the file as "
                         "UTF-8 (a Latin-1 or Windows-1252 character, e.g. in a comment?)") from None
    text = text.removeprefix("\ufeff")
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        char = bad.group()
        what = {"\x00": "a NUL byte (\\x00)",
                "\x1b": "an escape character (\\x1b, as in terminal colour codes pasted from a shell)"}.get(
            char, f"the control character U+{ord(char):04X}")
        raise ValueError(f"{_where(text, bad.start())}: {what}; YAML allows only printable characters: delete it")
    return text


def _yaml_advice(text: str, exc: MarkedYAMLError) -> str:
    """The parser's complaint, with how to fix the common ones."""
    problem = str(exc.problem or exc)
    mark = exc.problem_mark
    if "'\\t'" in problem and mark is not None:
        before = text.splitlines()[mark.line][:mark.column] if mark.line < len(text.splitlines()) else ""
        if not before.strip():
            return ("a tab indents this line; YAML indents with spaces only (YAML 1.2, 6.1 \"Indentation Spaces\"): "
                    "replace each tab with spaces, e.g. two per level")
        return "a tab where YAML allows none (it separates nothing here): replace it with a space"
    return problem


class _BoundedConstructor(RoundTripConstructor):
    """Round-trip constructor that refuses integers longer than any field needs, with their line."""

    def construct_yaml_int(self, node: Any) -> Any:
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise ConstructorError(None, None, f"an integer of {digits} digits; no field takes more than "
                                   f"{MAX_INT_DIGITS} (is a value pasted twice?)", node.start_mark)
        return super().construct_yaml_int(node)


_BoundedConstructor.add_constructor("tag:yaml.org,2002:int", _BoundedConstructor.construct_yaml_int)


def _flow_depth_error(text: str) -> str | None:
    """Flow collections ([ [ [ ...) nested deeper than MAX_DEPTH, found before the recursive parser meets them."""
    depth, quote = 0, ""
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'" and depth:
            quote = char
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return f"{_where(text, index)}: brackets nested more than {MAX_DEPTH} deep; a fleet config needs fewer than 10"
        elif char in "]}":
            depth = max(0, depth - 1)
    return None


def read_document(path: str | Path, raw: bytes | None = None) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """The file's YAML as plain data with line numbers; ConfigError (one clear issue) for unreadable input.
    `raw`: the file's bytes when the caller has read them already."""
    path = Path(path)

    def refuse(message: str) -> ConfigError:
        return ConfigError(str(path), [ConfigIssue((), message)])

    if raw is None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise refuse(f"cannot read the file: {exc.strerror}") from None
    try:
        text = _decode(raw)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    deep = _flow_depth_error(text)
    if deep:
        raise refuse(deep)
    yaml = YAML(typ="rt")
    yaml.Constructor = _BoundedConstructor
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise refuse(f"malformed YAML at {line}{_yaml_advice(text, exc)}") from None
    except YAMLError as exc:
        raise refuse(f"malformed YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise refuse("nested too deeply for the YAML parser; a fleet config needs fewer than 10 levels") from None
    if doc is None:
        raise refuse("the file is empty")
    try:
        return _walk(doc)
    except _BadKey as exc:
        raise ConfigError(str(path), [ConfigIssue(exc.path, str(exc))], {exc.path: exc.line} if exc.line else None) \
            from None
    except _TooLarge as exc:
        where = ".".join(map(str, exc.path))
        raise refuse(f"{where}: {exc}" if where else str(exc)) from None


def load_config(path: str | Path) -> FleetConfig:
    """Read, parse and validate a fleet config file (YAML or JSON).

    A file already validated in this process with the same bytes (and the same data-table overrides) is
    not parsed again: the round-trip YAML parser that keeps line numbers is slow, and the model is frozen.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError:
        raw = None  # read_document names the problem
    key = (str(path), raw, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIX))))
    if raw is not None and key in _validated:
        return _validated[key]
    data, lines = read_document(path, raw)
    cfg = parse_config(data, str(path), lines)
    if raw is not None:
        if len(_validated) >= 16:
            _validated.pop(next(iter(_validated)))
        _validated[key] = cfg
    return cfg


_validated: dict[tuple[Any, ...], FleetConfig] = {}


def single_form_path(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """models[0].calibration.x -> calibration.x; models[0].x -> model.x; anything else unchanged."""
    if path[:2] != ("models", 0):
        return path
    if path[2:3] == ("calibration",):
        return path[2:]
    return ("model",) + path[2:]


def config_from_json(text: str) -> FleetConfig:
    """The config as an instance (or a gateway) receives it: the parameter's value the stacks wrote (plain or
    compressed JSON), checked for its shape only.

    The fleet-level rules (`rules.check`: instance availability per region, cross-region PrivateLink pairs,
    AZ overlap, ...) read dated tables and operator overrides (`FLEETCAST_AVAILABILITY`, ...) that exist where
    synth and validate run, not on the instance; they ran there before this value was written. An instance
    checks what it can know itself: this shape, and its own pool's engine on its own GPU
    (runtime/trtllm.py `check_supported`, through fleetcast.contract.support).
    """
    source = "<delivered config>"
    try:
        data = json.loads(decode_parameter(text))
    except RecursionError:
        raise ConfigError(source, [ConfigIssue((), f"nested more than {MAX_DEPTH} levels deep")]) from None
    except ValueError as exc:
        raise ConfigError(source, [ConfigIssue((), f"not the JSON the stacks write: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigIssue((), "the config must be a mapping at the top level")])
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _pydantic_issues(exc)) from None


def json_schema() -> dict[str, Any]:
    """The config's JSON Schema: the list form, and the single-model form (`model:` + `calibration:`) it also reads."""
    schema = FleetConfig.model_json_schema(mode="validation")
    props = schema["properties"]
    model_ref = props["models"]["items"]
    props["model"] = {**model_ref, "description": "The single-model form: one model, read as a one-entry `models` "
                                                 "list (its calibration may be given at the top level)."}
    props["calibration"] = {"anyOf": [{"$ref": "#/$defs/CalibrationSpec"}, {"type": "null"}],
                            "description": "Single-model form only: the model's calibration."}
    schema["required"] = [r for r in schema["required"] if r != "models"]
    schema["oneOf"] = [{"required": ["models"], "not": {"anyOf": [{"required": ["model"]}, {"required": ["calibration"]}]}},
                       {"required": ["model"], "not": {"required": ["models"]}}]
    return schema
