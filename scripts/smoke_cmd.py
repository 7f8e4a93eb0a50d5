"""`fleetcast smoke`: one streamed completion through the endpoint; prints TTFT and tokens."""

from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("smoke", help="send one streamed completion and print TTFT and tokens")
    parser.add_argument("--endpoint", required=True, help="base URL, e.g. http://vpce-...amazonaws.com:8000")
    parser.add_argument("--prompt", default="The capital of South Korea is")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", help="only this model (default: every model /v1/models lists, one completion each)")
    parser.add_argument("--config", help="fleet config: check that the endpoint lists exactly the models --consumer "
                                         "may call and refuses the others (and an unknown id) with 404 model_not_found")
    parser.add_argument("--consumer", help="with --config: the consumer whose endpoint this is (default: the "
                                           "config's only consumer)")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the consumer API key")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_smoke)


def _smoke(args: argparse.Namespace) -> int:
    from fleetcast.contract.errors import UserError
    from fleetcast.smoke import smoke, smoke_models

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UserError(f"--api-key-env {args.api_key_env}: that variable is not set", 2)
    if args.consumer and not args.config:
        raise UserError("--consumer goes with --config (the config says which models that consumer may call)", 2)
    if args.model and args.config:
        raise UserError("--model and --config exclude each other: --config checks every model the consumer may "
                        "call", 2)
    common = {"prompt": args.prompt, "max_tokens": args.max_tokens, "api_key": api_key, "timeout_s": args.timeout}
    if args.model:
        result = smoke(args.endpoint, model=args.model, **common)
        print(result.to_json() if args.json else "\n".join(result.lines()))
        return 0
    if args.config:
        expected, not_entitled, who = _entitlements(args.config, args.consumer)
        report = smoke_models(args.endpoint, expected=expected, not_entitled=not_entitled, who=who, **common)
    else:
        report = smoke_models(args.endpoint, **common)
        if len(report.results) == 1 and not report.failures:  # a one-model endpoint: the output it always had
            print(report.results[0].to_json() if args.json else "\n".join(report.results[0].lines()))
            return 0
    print(report.to_json() if args.json else "\n".join(report.lines()))
    if report.failures:
        raise UserError(f"smoke test failed: {'; '.join(report.failures)}")
    return 0


def _entitlements(config: str, consumer: str | None) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(the ids `consumer` may call, the config's other model and adapter ids, 'consumer NAME')."""
    from fleetcast.config import load_config
    from fleetcast.contract.errors import UserError

    cfg = load_config(config)
    names = [c.name for c in cfg.consumers]
    if consumer is None:
        if len(names) != 1:
            raise UserError(f"--consumer is needed: the config has {len(names)} consumers ({', '.join(names)})", 2)
        consumer = names[0]
    if consumer not in names:
        raise UserError(f"--consumer {consumer!r} is not a consumer of the config; choose one of: "
                        f"{', '.join(names)}", 2)
    allowed = cfg.models_for(consumer)
    every = [i for m in cfg.models for i in (m.id, *(a.id for a in m.adapters))]
    return allowed, tuple(i for i in every if i not in allowed), f"consumer {consumer}"
