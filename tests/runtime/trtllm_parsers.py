"""argparse parsers rebuilt from the extracted TensorRT-LLM 1.2.x option data (trtllm_1_2_1_cli.py)."""

from __future__ import annotations

import argparse

from tests.runtime import trtllm_1_2_1_cli as spec

TYPES = {"int": int, "float": float, "str": str}


class Refused(Exception):
    """The release's parser would have rejected the command line (argparse exits 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would sys.exit; callers want the reason
        raise Refused(message)


def parser_from(options: dict, positionals: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    parser = _Parser(add_help=False, allow_abbrev=False)
    for name in positionals:
        parser.add_argument(name)
    for name, o in options.items():
        names = [name, *o.get("aliases", [])]
        if o["kind"] == "flag":
            parser.add_argument(*names, action="store_true")
        else:
            kwargs = {"type": TYPES[o["type"]]}
            if "choices" in o:
                kwargs["choices"] = o["choices"]
            if o["kind"] == "optional":
                kwargs.update(nargs="?", const=o["choices"][0])
            parser.add_argument(*names, **kwargs)
    return parser


CONVERT = parser_from(spec.CONVERT_CHECKPOINT_GPT)
QUANTIZE = parser_from(spec.QUANTIZE)
BUILD = parser_from(spec.TRTLLM_BUILD)
SERVE = parser_from(spec.TRTLLM_SERVE, tuple(spec.TRTLLM_SERVE_POSITIONAL))
