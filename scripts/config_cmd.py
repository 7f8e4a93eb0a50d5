"""`fleetcast config validate|schema|docs|show|diff`."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    from fleetcast.aws_session import add_aws_arguments

    parser = sub.add_parser("config", help="validate the fleet config, show what a change rolls (diff), export its schema and reference")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    validate = actions.add_parser(
        "validate", help="report every problem in a config file (exit 1 if any)",
        description="Validate a fleet config: every problem with its YAML path, line and what is allowed (exit 1). "
                    "--deploy also refuses what is valid but cannot work in a real account: AWS documentation "
                    "example account ids (111122223333, 123456789012, ...) and placeholder VPC/subnet/endpoint "
                    "service/AMI ids, each with what to put instead (exit 1); it warns on `latest` AMIs and on a "
                    "model.revision that is not a commit. With AWS credentials for provider.account it also checks "
                    "each AZ name -> AZ ID pair against ec2:DescribeAvailabilityZones; without them it says so.")
    validate.add_argument("file", help="fleet config YAML, e.g. config/fleet.yaml")
    validate.add_argument("--deploy", action="store_true",
                          help="also check deploy readiness (what `fleetcast deploy` checks before any step)")
    validate.add_argument("--profile", help="with --deploy: AWS named profile for the AZ check")
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
                      help="exit 3 when any existing pool would roll (a guard for pipelines that must not replace "
                           "instances)")
    diff.set_defaults(handler=_diff)


def _validate(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    cfg = load_config(args.file)
    pools = sum(len(r.pools) for r in cfg.regions)
    print(f"{args.file}: valid ({len(cfg.regions)} region(s), {pools} pool(s), {len(cfg.consumers)} consumer(s); "
          f"digest {cfg.digest()[:12]})")
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
    from fleetcast.errors import UserError

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
    return 3 if args.fail_on_roll and impact.rolls else 0


def _diff_deployed(args: argparse.Namespace, new) -> int:
    from fleetcast.config.impact import diff_configs, render_impact
    from fleetcast.aws_session import AwsSession
    from fleetcast.deployed import deployed_config
    from fleetcast.errors import UserError

    names = [r.region for r in new.regions]
    if args.region and args.region not in names:
        raise UserError(f"--region {args.region!r} is not a provider region of fleet {new.name}; "
                        f"choose one of: {', '.join(names)}", 2)
    access = AwsSession(args.profile)
    report, rolls = [], False
    for region in [args.region] if args.region else names:
        old = deployed_config(access, new, region)
        if old is None:
            report.append({"region": region, "deployed": False})
            if not args.json:
                print(f"== {region}: not deployed yet (no {new.config_parameter_name} parameter): its pools are new\n")
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


def _show(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    print(json.dumps(load_config(args.file).model_dump(mode="json"), indent=2))
    return 0
