"""`fleetcast config validate|schema|docs|show|diff`."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="validate the fleet config, export its JSON Schema")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    validate = actions.add_parser("validate", help="report every problem in a config file (exit 1 if any)")
    validate.add_argument("file", help="fleet config YAML, e.g. config/fleet.yaml")
    validate.set_defaults(handler=_validate)

    schema = actions.add_parser("schema", help="print the config's JSON Schema")
    schema.set_defaults(handler=_schema)

    docs = actions.add_parser("docs", help="print the config reference (docs/config.md) generated from the schema")
    docs.set_defaults(handler=_docs)

    show = actions.add_parser("show", help="print the validated config with defaults filled in, as JSON")
    show.add_argument("file")
    show.set_defaults(handler=_show)

    diff = actions.add_parser(
        "diff", help="what changing OLD into NEW does to a deployed fleet: changed fields, and which pools roll",
        description="Compare two fleet configs after validation (defaults filled in). Lists the changed fields "
                    "and, per pool, whether its launch template changes (instance refresh), stays (no instance "
                    "replaced), or the pool is new or removed. Consumer changes reach running gateways without a "
                    "restart. Compare with the deployed one, e.g. "
                    "`fleetcast config diff <(git show main:config/fleet.yaml) config/fleet.yaml`.")
    diff.add_argument("old", help="the config as deployed")
    diff.add_argument("new", help="the config about to be deployed")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.add_argument("--fail-on-roll", action="store_true",
                      help="exit 3 when any existing pool would roll (a guard for pipelines that must not replace "
                           "instances)")
    diff.set_defaults(handler=_diff)


def _validate(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    cfg = load_config(args.file)
    pools = sum(len(r.pools) for r in cfg.regions)
    print(f"{args.file}: valid ({len(cfg.regions)} region(s), {pools} pool(s), {len(cfg.consumers)} consumer(s); "
          f"digest {cfg.digest()[:12]})")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from fleetcast.config import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _docs(args: argparse.Namespace) -> int:
    from fleetcast.config.reference import render

    print(render(), end="")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.config.impact import diff_configs, render_impact

    impact = diff_configs(load_config(args.old), load_config(args.new))
    if args.json:
        print(json.dumps(impact.to_json(), indent=2, default=str))
    else:
        print(render_impact(impact), end="")
    return 3 if args.fail_on_roll and impact.rolls else 0


def _show(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    print(json.dumps(load_config(args.file).model_dump(mode="json"), indent=2))
    return 0
