"""`fleetcast smoke`: one streamed completion through the endpoint; prints TTFT and tokens."""

from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("smoke", help="send one streamed completion and print TTFT and tokens")
    parser.add_argument("--endpoint", required=True, help="base URL, e.g. http://vpce-...amazonaws.com:8000")
    parser.add_argument("--prompt", default="The capital of South Korea is")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the consumer API key")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_smoke)


def _smoke(args: argparse.Namespace) -> int:
    from fleetcast.contract.errors import UserError
    from fleetcast.smoke import smoke

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UserError(f"--api-key-env {args.api_key_env}: that variable is not set", 2)
    result = smoke(args.endpoint, prompt=args.prompt, max_tokens=args.max_tokens, model=args.model,
                   api_key=api_key, timeout_s=args.timeout)
    print(result.to_json() if args.json else "\n".join(result.lines()))
    return 0
