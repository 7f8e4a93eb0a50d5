"""`fleetcast`: one command, one subcommand per job.

Each subcommand lives in its own module exposing `register(subparsers)`; the
module is imported only when listed here, and its heavy imports stay inside
its handler so `fleetcast --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fleetcast import __version__

# (module under scripts/, subcommand) in help order. A module missing from the
# tree is skipped, so a partial checkout still runs what it has.
SUBCOMMANDS = (
    "config_cmd",
    "synth_cmd",
    "stage_cmd",
    "deploy_cmd",
    "ami_cmd",
    "smoke_cmd",
    "connections_cmd",
    "usage_cmd",
    "traffic_cmd",
    "bench_cmd",
    "plan_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetcast",
        description="Private TensorRT-LLM fleets on AWS from one config file.",
    )
    parser.add_argument("--version", action="version", version=f"fleetcast {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        # Relative to this package: `scripts` in the repository, `fleetcast_cli` installed from the wheel.
        try:
            module = importlib.import_module(f".{name}", __package__)
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `fleetcast` command; Ctrl-C and a closed stdout end it as they end Unix tools (contract/entry.py)."""
    from fleetcast.contract.entry import run_quietly

    return run_quietly(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    from fleetcast.config import ConfigError
    from fleetcast.contract.errors import EXIT_INVALID, FleetcastError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_INVALID
    except FleetcastError as exc:  # user input, AWS access or an AWS failure: one line, its exit code
        print(f"fleetcast {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        # A botocore failure a command did not map itself still ends as one line and exit 4/5.
        from fleetcast.aws_session import is_aws_error, translate

        if not is_aws_error(exc):
            raise
        error = translate(exc)
        print(f"fleetcast {args.command}: {error}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
