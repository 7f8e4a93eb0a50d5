"""`fleetcast config validate|schema|docs|show|diff|init`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from fleetcast.config import FleetConfig
    from fleetcast.config.init import ConsumerAnswer

_T = TypeVar("_T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.aws_session import add_aws_arguments

    parser = sub.add_parser("config", help="start a fleet config (init), validate it, show what a change rolls (diff), export its schema and reference")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    validate = actions.add_parser(
        "validate", help="report every problem in a config file (exit 1 if any)",
        description="Validate a fleet config: every problem with its YAML path, line and what is allowed (exit 1). "
                    "--deploy also refuses what is valid but cannot work in a real account, recognized by rule: AWS "
                    "documentation example account ids (111122223333, 123456789012, ...), placeholder VPC/subnet/"
                    "endpoint service/AMI ids (`config init`'s and AWS's), AWS's example buckets, documentation mail "
                    "domains (RFC 2606) and CIDRs (RFC 5737), each with what to put instead (exit 1); it warns on "
                    "`latest` AMIs and on a model.revision that is not a commit. With AWS credentials for "
                    "provider.account it also checks each AZ name -> AZ ID pair against "
                    "ec2:DescribeAvailabilityZones and each pinned AMI id against ec2:DescribeImages in its region; "
                    "without them it says so, and warns when two regions pin one AMI id.")
    validate.add_argument("file", help="fleet config YAML, e.g. config/fleet.yaml")
    validate.add_argument("--deploy", action="store_true",
                          help="also check deploy readiness (what `fleetcast deploy` checks before any step): placeholder "
                               "and documentation-example values; with credentials, AZ IDs and pinned AMIs per region")
    validate.add_argument("--profile", help="with --deploy: AWS named profile for the AZ and pinned-AMI checks")
    validate.set_defaults(handler=_validate)

    schema = actions.add_parser("schema", help="print the config's JSON Schema")
    schema.set_defaults(handler=_schema)

    docs = actions.add_parser("docs", help="print the config reference (docs/config.md) generated from the schema")
    docs.set_defaults(handler=_docs)

    show = actions.add_parser("show", help="print the validated config with defaults filled in, in the list form (`models:`), as YAML (JSON for a "
                                       "JSON file); fleet engine defaults that every model overrides are left out")
    show.add_argument("file")
    show.set_defaults(handler=_show)

    diff = actions.add_parser(
        "diff", help="what changing OLD into NEW does to a deployed fleet: changed fields, and which pools roll",
        usage="fleetcast config diff OLD NEW | --deployed NEW [--region R] [--profile P]  [--json] [--fail-on-roll]",
        description="Compare two fleet configs after validation (defaults filled in). Lists the changed fields "
                    "and, per pool, whether its launch template changes (instance refresh), stays (no instance "
                    "replaced), or the pool is new or removed. Consumer changes reach running gateways without a "
                    "restart. OLD is a file (e.g. `<(git show main:config/fleet.yaml)`), or, with --deployed, "
                    "what each provider region runs now: its /<fleet>/config SSM parameter (needs "
                    "ssm:GetParameter; standard AWS credentials).")
    diff.add_argument("configs", nargs="+", metavar="CONFIG", help="OLD NEW, or NEW alone with --deployed")
    diff.add_argument("--deployed", action="store_true",
                      help="compare NEW with the config each provider region runs now (its SSM parameter)")
    add_aws_arguments(diff, region_help="with --deployed: only this provider region (--profile too: with --deployed)")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.add_argument("--fail-on-roll", action="store_true",
                      help="exit 3 when any existing pool would roll, or the fleet's name changes (a second fleet "
                           "beside the old one): a guard for pipelines that must not replace instances")
    diff.set_defaults(handler=_diff)

    _register_init(actions)


def _validate(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    cfg = load_config(args.file)
    pools = sum(len(r.pools) for r in cfg.regions)
    print(f"{args.file}: valid ({len(cfg.regions)} region(s), {pools} pool(s), {len(cfg.consumers)} consumer(s); "
          f"digest {cfg.digest()[:12]})")
    from fleetcast.config.kv_room import kv_room_warnings

    for warning in kv_room_warnings(cfg):  # allowed, but worth knowing before a deploy
        print(f"warning: {warning.dotted}: {warning.message}")
    if not args.deploy:
        return 0
    from fleetcast.config.readiness import access_with_credentials, check_readiness, line_index

    readiness = check_readiness(cfg, access_with_credentials(args.profile))
    print(readiness.render(args.file, line_index(args.file)))
    return 0 if readiness.ready else 1


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
    from fleetcast.contract.errors import UserError

    if args.deployed:
        if len(args.configs) != 1:
            raise UserError("config diff --deployed takes one CONFIG (the one about to be deployed), "
                            f"got {len(args.configs)}", 2)
        return _diff_deployed(args, load_config(args.configs[0]))
    if len(args.configs) != 2 or args.region or args.profile:
        raise UserError("config diff takes OLD NEW (two files); --region and --profile go with --deployed NEW", 2)
    impact = diff_configs(load_config(args.configs[0]), load_config(args.configs[1]))
    if args.json:
        print(json.dumps(impact.to_json(), indent=2, default=str))
    else:
        print(render_impact(impact), end="")
    return 3 if args.fail_on_roll and (impact.rolls or impact.renamed) else 0


def _diff_deployed(args: argparse.Namespace, new: FleetConfig) -> int:
    from fleetcast.aws_session import AwsSession
    from fleetcast.config.impact import diff_configs, render_impact
    from fleetcast.contract.errors import UserError
    from fleetcast.deployed import deployed_config

    names = [r.region for r in new.regions]
    if args.region and args.region not in names:
        raise UserError(f"--region {args.region!r} is not a provider region of fleet {new.name}; "
                        f"choose one of: {', '.join(names)}", 2)
    access = AwsSession(args.profile)
    report, rolls = [], False
    for region in [args.region] if args.region else names:
        old = deployed_config(access, new, region)
        if old is None:
            others = _other_fleets(access, new, region)
            report.append({"region": region, "deployed": False, "other_fleets": others})
            if not args.json:
                print(f"== {region}: not deployed yet (no {new.config_parameter_name} parameter): its pools are new")
                if others:
                    print(f"   The region runs {', '.join(others)}: if this config renames that fleet, a deploy creates "
                          f"a second, parallel fleet with new endpoint service names and the old one keeps running "
                          f"(`fleetcast deploy` asks first).")
                print()
            continue
        impact = diff_configs(old, new).for_region(region)
        rolls = rolls or bool(impact.rolls)
        report.append({"region": region, "deployed": True, "deployed_digest": old.digest(), **impact.to_json()})
        if not args.json:
            print(f"== {region}: deployed config {old.digest()[:12]} -> {new.digest()[:12]}")
            print(render_impact(impact))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    return 3 if args.fail_on_roll and rolls else 0


def _other_fleets(access: Any, cfg: FleetConfig, region: str) -> list[str]:
    """Other fleets' provider stacks in `region`; a missing cloudformation:DescribeStacks only skips the check."""
    from fleetcast.aws_session import AwsCallError
    from fleetcast.deployed import other_fleets

    try:
        return other_fleets(access, cfg, region)
    except AwsCallError as exc:
        print(f"{region}: other fleets not checked: {exc}", file=sys.stderr)
        return []


def _show(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fleetcast.config import load_config
    from fleetcast.config.model import LIST_FORM

    cfg = load_config(args.file)
    # The normalized form: a `models:` list even where the file uses the single-model `model:`.
    data = cfg.model_dump(mode="json", context=LIST_FORM)
    unused = cfg.unused_engine_defaults()
    for name in unused:  # defaults no pool builds with would read as settings of the fleet
        del data["engine"][name]
    note = (f"engine.{', engine.'.join(unused)}: left out, every model sets its own (models[].engine or "
            "pools[].engine)") if unused else ""
    try:
        json.loads(Path(args.file).read_text())
        as_json = True  # a JSON file is printed as JSON; anything else as the YAML it was written in
    except ValueError:
        as_json = False
    if as_json:
        print(json.dumps(data, indent=2))
        if note:
            print(note, file=sys.stderr)
        return 0
    from ruamel.yaml import YAML

    if note:
        print(f"# {note}")
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]  # ruamel declares it None (default: sort)
    yaml.dump(data, sys.stdout)
    return 0


def _register_init(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.config.init import DEFAULT_MODEL, MODEL_PRESETS

    init = actions.add_parser(
        "init", help="write a commented minimal config that validates (asks, or takes flags)",
        description="Write a commented, minimal fleet config from a few answers: provider account, regions, "
                    "model and consumers. Asks for what the flags leave out when stdin is a terminal; without a "
                    "terminal the flags must suffice. The result is validated before it is written; values init "
                    "cannot know (consumer VPC and subnet ids, CIDRs, AZ IDs) are marked REPLACE.")
    init.add_argument("--account", help="provider account id (12 digits): owns the fleets and endpoint services")
    init.add_argument("--regions", help="provider regions, comma-separated, e.g. ap-northeast-2,us-east-1")
    init.add_argument("--model", action="append", default=[],
                      help=f"a model to serve: {', '.join(MODEL_PRESETS)} (repeat for several: a `models:` list, every "
                           f"pool serving each; default {DEFAULT_MODEL})")
    init.add_argument("--consumer", action="append", default=[], metavar="NAME=ACCOUNT[@REGION]",
                      help="a consumer account (repeat for more); REGION defaults to the first provider region")
    init.add_argument("--name", default="fleetcast", help="fleet name, prefixes stack names (default fleetcast)")
    init.add_argument("--out", default="config/fleet.yaml", help="file to write (default config/fleet.yaml)")
    init.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    init.set_defaults(handler=_init)


def _init(args: argparse.Namespace) -> int:
    import os
    import sys
    import tempfile
    from pathlib import Path

    from fleetcast.config import ConfigError, load_config
    from fleetcast.config.init import DEFAULT_MODEL, InitAnswers, check_account, check_region, parse_consumer, render
    from fleetcast.contract.errors import UserError

    out = Path(args.out)
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; pass --force to overwrite it, or --out another file", 2)
    interactive = sys.stdin.isatty()
    missing = [flag for flag, value in (("--account", args.account), ("--regions", args.regions),
                                        ("--consumer", args.consumer)) if not value]
    if missing and not interactive:
        raise UserError(f"no terminal to ask on: pass {', '.join(missing)} (see `fleetcast config init --help`)", 2)

    def ask(prompt: str, check: Callable[[str], _T], default: str | None = None) -> _T:
        while True:
            answer = input(f"{prompt}{f' [{default}]' if default else ''}: ").strip() or (default or "")
            try:
                return check(answer)
            except ValueError as exc:
                print(f"  {exc}", file=sys.stderr)

    try:
        account = check_account(args.account, "--account") if args.account else \
            ask("provider account id (12 digits)", lambda v: check_account(v, "account"))
        regions = tuple(check_region(r, "--regions") for r in args.regions.split(",") if r.strip()) if args.regions \
            else ask("provider regions (comma-separated)", lambda v: tuple(
                check_region(r, "regions") for r in v.split(",") if r.strip()) or _none("a region"), "ap-northeast-2")
        models = tuple(args.model) or (ask("models (comma-separated)", lambda v: tuple(
            m.strip() for m in v.split(",") if m.strip()), DEFAULT_MODEL) if interactive else (DEFAULT_MODEL,))
        consumers = tuple(parse_consumer(c) for c in args.consumer)
        if not consumers:
            print("consumers, one per line as NAME=ACCOUNT[@REGION]; an empty line ends", file=sys.stderr)
            collected: list[ConsumerAnswer] = []
            while True:
                line = input("consumer: ").strip()
                if not line and collected:
                    break
                try:
                    collected.append(parse_consumer(line))
                except ValueError as exc:
                    print(f"  {exc}", file=sys.stderr)
            consumers = tuple(collected)
        text = render(InitAnswers(account=account, regions=regions, models=models, consumers=consumers, name=args.name))
    except EOFError:
        raise UserError("input ended before every answer was given", 2) from None
    except ValueError as exc:
        raise UserError(str(exc), 2) from None

    # Validate what would be written (the written file is exactly this text).
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fleetcast-init-", suffix=".yaml", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        try:
            cfg = load_config(tmp)
        except ConfigError as exc:
            raise UserError("these answers make a config that does not validate:\n" +
                            exc.render().split("\n", 1)[1], 1) from None
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"wrote {out}: valid ({len(cfg.models)} model(s), {len(cfg.regions)} region(s), {len(cfg.consumers)} "
          "consumer(s)); fill in the lines "
          f"marked REPLACE, then `fleetcast config validate {out}`")
    return 0


def _none(what: str) -> NoReturn:
    raise ValueError(f"name at least {what}")
