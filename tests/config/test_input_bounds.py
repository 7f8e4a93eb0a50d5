"""Input that used to crash or hang the validator (issue 14 item 10): each gets one clear error.

From `load_config`, from `fleetcast config validate` (no traceback, exit 1) and from the CDK
entry point behind `make synth` (app.py, in tests/stacks/test_app.py: it builds CDK apps), alike. Time is bounded by size limits, not measured:
the tests check the limits that bound it (file bytes, nesting, entries, integer digits).
"""

from pathlib import Path

import pytest

from fleetcast.config import ConfigError, load_config, loader
from scripts.cli import main

from .conftest import DEFAULT

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = DEFAULT.read_bytes()


def _with(extra: bytes) -> bytes:
    return SHIPPED + extra


BAD_INPUTS = {
    # name: (file bytes, what the one message says)
    "latin1_comment": (_with("# café\n".encode("latin-1")), "byte 0xe9 is not UTF-8"),
    "utf16": (SHIPPED.decode().encode("utf-16"), "encoded as UTF-16; save it as UTF-8"),
    "utf16_without_bom": (SHIPPED.decode().encode("utf-16-le"), "looks like UTF-16 or binary"),
    "random_bytes": (bytes((i * 167 + 13) % 256 for i in range(4096)), "is not UTF-8"),
    "nul_byte": (_with(b'extra: "a\x00b"\n'), "a NUL byte"),
    "ansi_escape": (SHIPPED.replace(b"name: fleetcast\n", b"name: \x1b[32mfleetcast\x1b[0m\n"), "escape character"),
    "huge_integer": (SHIPPED.replace(b"max_batch_size: 64", b"max_batch_size: " + b"9" * 5000), "an integer of 5000 digits"),
    "deep_flow_lists": (_with(b"deep: " + b"[" * 5000 + b"]" * 5000 + b"\n"), "brackets nested more than"),
    "deep_block_maps": (b"".join(b" " * i + b"k%d:\n" % i for i in range(600)) + b" " * 600 + b"x: 1\n", "nested"),
    "alias_bomb": (b'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n' + b"".join(
        b"b%d: &b%d [%s]\n" % (i, i, b",".join([b"*a" if i == 1 else b"*b%d" % (i - 1)] * 10)) for i in range(1, 10)),
        "keys and list items"),
    "200k_unknown_keys": (_with(b"".join(b"k%d: 1\n" % i for i in range(200_000))), "a fleet config is at most"),
    "20k_unknown_keys_under_the_size_limit": (b"".join(b"k%d: 1\n" % i for i in range(21_000)), "keys and list items"),
}


def _write(name: str, tmp_path: Path) -> tuple[Path, str]:
    data, expected = BAD_INPUTS[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    return path, expected


@pytest.fixture(params=sorted(BAD_INPUTS))
def bad_file(request, tmp_path):
    return _write(request.param, tmp_path)


# `config validate` is load_config and the CLI's one ConfigError handler: each input whose message quotes what the
# file holds (a byte, a character, a place) goes through the printing too. The entry bound's message is a fixed
# sentence, as the size bound's (200k_unknown_keys) is, and reaching it parses 21,000 keys (3 s of CPU): its message
# is checked from load_config above.
@pytest.fixture(params=sorted(set(BAD_INPUTS) - {"20k_unknown_keys_under_the_size_limit"}))
def bad_file_for_the_cli(request, tmp_path):
    return _write(request.param, tmp_path)


def test_each_bad_input_is_one_clear_error(bad_file):
    path, expected = bad_file
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert len(caught.value.issues) == 1, caught.value.render()
    assert expected in caught.value.issues[0].message
    assert caught.value.render().startswith(f"{path}: 1 problem(s)")


def test_config_validate_prints_it_without_a_traceback(bad_file_for_the_cli, capsys):
    path, expected = bad_file_for_the_cli
    assert main(["config", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and str(path) in err


def test_errors_with_a_place_name_line_and_column(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_bytes(SHIPPED.replace(b"name: fleetcast\n", b"name: \x1b[32mfleetcast\n"))
    name_line = SHIPPED.split(b"name: fleetcast\n")[0].count(b"\n") + 1
    with pytest.raises(ConfigError, match=rf"line {name_line}, column 7: an escape character"):
        load_config(path)
    path.write_bytes(_with("# café\n".encode("latin-1")))
    line = SHIPPED.count(b"\n") + 1
    with pytest.raises(ConfigError, match=rf"line {line}, column 6: byte 0xe9"):
        load_config(path)
    path.write_bytes(SHIPPED.replace(b"max_batch_size: 64", b"max_batch_size: " + b"9" * 5000))
    line = SHIPPED[: SHIPPED.index(b"max_batch_size")].count(b"\n") + 1
    with pytest.raises(ConfigError, match=rf"line {line}, column 19: an integer of 5000 digits"):
        load_config(path)


def test_the_bounds_leave_room_for_real_configs():
    """The shipped config is far inside every bound (a config with hundreds of consumers still fits)."""
    data, _ = loader.read_document(DEFAULT)
    entries, depth = 0, 0

    def walk(node, level):
        nonlocal entries, depth
        depth = max(depth, level)
        if isinstance(node, dict):
            entries += len(node)
            for v in node.values():
                walk(v, level + 1)
        elif isinstance(node, list):
            entries += len(node)
            for v in node:
                walk(v, level + 1)

    walk(data, 0)
    assert len(SHIPPED) * 50 < loader.MAX_FILE_BYTES
    assert entries * 50 < loader.MAX_ENTRIES
    assert depth * 3 < loader.MAX_DEPTH
    assert len(str(2**64)) < loader.MAX_INT_DIGITS


def test_utf8_bom_and_unicode_text_are_fine(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + SHIPPED + "# Überprüft: 서울\n".encode())
    assert load_config(path).name == "fleetcast"


def test_many_problems_are_listed_up_to_a_bound(tmp_path):
    path = tmp_path / "f.yaml"
    # Past the problems listed and past the 4 x MAX_ISSUES that the loader words at all (_pydantic_issues).
    path.write_bytes(_with(b"".join(b"k%d: 1\n" % i for i in range(5 * loader.MAX_ISSUES))))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = caught.value.render()
    assert text.count("\n  - ") == loader.MAX_ISSUES and "more (the first 100 are listed)" in text


def test_delivered_config_is_bounded_too():
    from fleetcast.config import config_from_json

    with pytest.raises(ConfigError, match="nested more than"):
        config_from_json("[" * 100_000 + "]" * 100_000)
