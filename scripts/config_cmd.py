"""`fleetcast config validate|schema|docs|show`."""

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


def _show(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    print(json.dumps(load_config(args.file).model_dump(mode="json"), indent=2))
    return 0
