"""Generate the config reference (docs/config.md) from the config's JSON Schema.

The schema is derived from the pydantic models, so field names, types,
defaults, allowed values and descriptions cannot drift from what validation
enforces; a test fails when docs/config.md differs from `render()`.
"""

from __future__ import annotations

import json
from typing import Any

from .loader import json_schema
from .model import CALIBRATED_POOLS_ONLY, NOT_IN_INSTANCE_DIGEST, SEVERAL_PROCESS_POOLS_ONLY

GENERATE_COMMAND = "fleetcast config docs > docs/config.md"

# A short note for sections whose model has no docstring of its own.
SECTION_NOTES = {
    "Provider": "The account that deploys every provider stack.",
    "Network": "How instances reach AWS services, and whether the NLB listener terminates TLS.",
    "Operations": "Log retention, drain and launch-hook timing, build circuit breaker, connection approval.",
    "Capacity": "Instance counts of one pool; min <= max (and min <= desired <= max when desired is fixed).",
    "AvailabilityZone": "A zone by name (this account's view) and by AZ ID (the same zone in every account).",
    "NewVpc": "A VPC Fleetcast creates, with isolated private subnets (or private + public with NAT).",
    "ExistingVpc": "An existing VPC imported by ids (never looked up): one private subnet per configured AZ.",
    "ConsumerSubnet": "A consumer subnet by id and AZ ID; AZ IDs must overlap the provider's.",
    "WarmPoolSpec": "Stopped instances that already hold the engine and image on disk.",
}


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = _ref_name(prop["$ref"])
        target = defs[name]
        if "enum" in target:
            return "enum"
        return f"[{name}](#{name.lower()})"
    for union in ("anyOf", "oneOf"):  # oneOf: a discriminated union (regions[].vpc)
        if union in prop:
            return " or ".join(_type(p, defs) for p in prop[union])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return "enum"
    kind: str = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"map of {_type(prop['additionalProperties'], defs)}"
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean", "null": "null"}.get(kind, kind)


def _constraints(prop: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    out = []
    enum = prop.get("enum")
    if "$ref" in prop and "enum" in defs[_ref_name(prop["$ref"])]:
        enum = defs[_ref_name(prop["$ref"])]["enum"]
    if enum:
        out.append("one of " + ", ".join(f"`{v}`" for v in enum))
    for key, label in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"),
                       ("minItems", "items >="), ("maxItems", "items <="), ("minLength", "length >="),
                       ("maxLength", "length <=")):
        if key in prop:
            out.append(f"{label} {prop[key]}")
    if "pattern" in prop:
        out.append(f"pattern `{prop['pattern']}`")
    for key in ("anyOf", "oneOf"):
        for option in prop.get(key, []):
            out += [c for c in _constraints(option, defs) if c not in out]
    if prop.get("type") == "array" and isinstance(prop.get("items"), dict):
        out += [f"each: {c}" for c in _constraints(prop["items"], defs)]
    return out


def rolls_instances(path: str, field: str) -> str:
    """yes / no / partly / calibrated pools / pools of several processes: does changing this field replace the instances of the pools it concerns?

    Read from NOT_IN_INSTANCE_DIGEST, the same spec `FleetConfig.instance_digest` excludes, so the
    reference cannot disagree with what the launch templates carry.
    """
    parts = [p for p in path.replace("[]", ".[]").replace(".<key>", "").split(".") if p] + [field]
    # A model's calibration: models[].calibration, or the single-model form's top-level one.
    head = parts[2:] if parts[:2] == ["models", "[]"] else parts
    if head and head[0] in CALIBRATED_POOLS_ONLY:
        return "calibrated pools"
    if parts[:2] == ["models", "[]"] and head[0] in SEVERAL_PROCESS_POOLS_ONLY:
        return "pools of several processes"
    spec: Any = NOT_IN_INSTANCE_DIGEST
    for part in parts:
        if spec is True:
            return "no"
        if isinstance(spec, (set, frozenset)):
            spec = {name: True for name in spec}
        if not isinstance(spec, dict):
            return "yes"
        spec = spec.get("__all__" if part == "[]" else part)
        if spec is None:
            return "yes"
    return "no" if spec is True else "partly"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(title: str, path: str, model: dict[str, Any], defs: dict[str, Any], note: str | None) -> list[str]:
    lines = [f"## {title}", "", f"YAML path: `{path}`" if path else "YAML path: top level", ""]
    description = model.get("description") or note
    if description:
        lines += [description.strip(), ""]
    lines += ["| Field | Type | Required / default | Allowed | Rolls instances | Description |",
              "|---|---|---|---|---|---|"]
    required = set(model.get("required", []))
    for name, prop in model.get("properties", {}).items():
        if name in required:
            presence = "required"
        elif "default" in prop:
            presence = f"default `{json.dumps(prop['default'])}`"
        else:
            presence = "optional"
        allowed = "; ".join(_constraints(prop, defs))
        description = prop.get("description", "")
        if not description:
            notes = [defs[child].get("description") or SECTION_NOTES.get(child, "")
                     for child, _ in _children(prop) if "enum" not in defs[child]]
            description = " / ".join(n.split(". ")[0].rstrip(".") for n in notes if n)
        lines.append(
            f"| `{name}` | {_cell(_type(prop, defs))} | {_cell(presence)} | {_cell(allowed)} | "
            f"{rolls_instances(path, name)} | {_cell(description)} |"
        )
    return lines + [""]


def _children(prop: dict[str, Any], suffix: str = "") -> list[tuple[str, str]]:
    """(def name, path suffix) of the models a property refers to."""
    if "$ref" in prop:
        return [(_ref_name(prop["$ref"]), suffix)]
    out = []
    for option in prop.get("anyOf", []) + prop.get("oneOf", []):
        out += _children(option, suffix)
    if prop.get("type") == "array" and isinstance(prop.get("items"), dict):
        out += _children(prop["items"], suffix + "[]")
    if isinstance(prop.get("additionalProperties"), dict):
        out += _children(prop["additionalProperties"], suffix + ".<key>")
    return out


def render() -> str:
    """The full docs/config.md text."""
    schema = json_schema()
    defs = schema.get("$defs", {})
    lines = [
        "# Fleet config reference",
        "",
        f"<!-- Generated from the config schema by `{GENERATE_COMMAND}`; do not edit by hand. -->",
        "",
        "One YAML file (default `config/fleet.yaml`) describes the whole fleet. It is validated once at load",
        "(`fleetcast config validate FILE` lists every problem with its YAML path); unknown keys are errors.",
        "Rules spanning several fields (precision per GPU, regional availability, cross-region PrivateLink",
        "pairs, AZ overlap, context length) are enforced by `fleetcast.config.rules`, each naming the path it blames.",
        "The JSON Schema itself: `fleetcast config schema`. A commented starting point: `fleetcast config init`.",
        "",
        "*Rolls instances*: whether a change to the field gives the pools it concerns a new launch template",
        "version, i.e. replaces their instances by instance refresh (`partly`: some of its fields do; `calibrated",
        "pools`: only pools whose precision reads a calibration set, SmoothQuant, FP8 or a quantized KV cache; `pools",
        "of several processes`: only pools that run more than one engine process, whose KV budgets it sets). Consumers",
        "reach running gateways within a minute instead; sizes, scaling, alarms and allow lists are stack",
        "settings applied in place. `fleetcast config diff OLD NEW` (or `--deployed NEW`) shows it for a change.",
        "",
    ]
    lines += _section("FleetConfig", "", schema, defs, None)
    # Breadth-first from the top level, so each model appears once under its first YAML path.
    queue = [(name, suffix) for field, prop in schema["properties"].items() for name, suffix in _children(prop, field)]
    seen: set[str] = set()
    while queue:
        name, path = queue.pop(0)
        model = defs[name]
        if name in seen or "enum" in model:
            continue
        seen.add(name)
        lines += _section(name, path, model, defs, SECTION_NOTES.get(name))
        for field, prop in model.get("properties", {}).items():
            queue += [(child, f"{path}.{field}{suffix}") for child, suffix in _children(prop)]
    return "\n".join(lines).rstrip() + "\n"
