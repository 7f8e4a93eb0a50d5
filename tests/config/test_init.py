"""`fleetcast config init` writes a commented minimal config that validates and synthesizes (issue 15 item 5)."""

import io

import pytest
from ruamel.yaml import YAML

from fleetcast.config import load_config
from scripts.cli import main

FLAGS = ["--account", "111122223333", "--regions", "ap-northeast-2,us-east-1",
         "--consumer", "voice-app=444455556666", "--consumer", "analytics=777788889999@us-west-2"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


@pytest.fixture(autouse=True)
def no_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdin", _Pipe(""))


def test_flags_alone_write_a_config_that_validates(tmp_path, capsys):
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", *FLAGS, "--out", str(out)]) == 0
    assert f"wrote {out}: valid" in capsys.readouterr().out
    cfg = load_config(out)
    assert [r.region for r in cfg.regions] == ["ap-northeast-2", "us-east-1"]
    analytics = next(c for c in cfg.consumers if c.name == "analytics")
    # us-west-2 has no provider region: it is served cross-region by the one PrivateLink connects it to.
    assert analytics.service_region == "us-east-1" and cfg.region("us-east-1").allowed_regions == ("us-west-2",)
    text = out.read_text()
    assert text.count("# REPLACE") >= 3 and 'account: "111122223333"' in text
    assert main(["config", "validate", str(out)]) == 0


def test_init_output_synthesizes(tmp_path):
    """The several-model form, synthesized (the one-model form is config/fleet.yaml's, synthesized elsewhere)."""
    from tests.stacks.synthesized import synthesize

    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", *FLAGS, "--out", str(out), *MODELS]) == 0
    fleet = synthesize(YAML(typ="safe").load(out.read_text()), "init")
    assert sorted(fleet.stacks) == ["fleetcast-provider-ap-northeast-2", "fleetcast-provider-us-east-1"]
    assert any("skipping consumer voice-app" in m for m in fleet.messages)  # no endpoint_service_name yet


MODELS = ["--model", "gpt2-xl", "--model", "qwen2.5-0.5b-instruct"]


def test_model_repeats_for_a_fleet_of_several_models(tmp_path, capsys):
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", *FLAGS, *MODELS, "--out", str(out)]) == 0
    assert "valid (2 model(s)" in capsys.readouterr().out
    cfg = load_config(out)
    assert [m.id for m in cfg.models] == ["gpt2-xl", "qwen2.5-0.5b-instruct"]
    for region in cfg.regions:
        for pool in region.pools:  # every pool serves one copy of each, each model with its own engine
            assert [(s.model.id, s.copies, s.engine.backend.value, s.engine.precision.value)
                    for s in cfg.served_by(pool)] == [("gpt2-xl", 1, "tensorrt", "int8_wo"),
                                                      ("qwen2.5-0.5b-instruct", 1, "pytorch", "bf16")]
    assert "models:" in out.read_text() and "\nmodel:" not in out.read_text()


def test_one_model_keeps_the_single_model_form(tmp_path):
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", *FLAGS, "--model", "qwen2.5-0.5b-instruct", "--out", str(out)]) == 0
    text = out.read_text()
    assert "\nmodel:\n  id: qwen2.5-0.5b-instruct\n" in text and "\nmodels:" not in text
    assert load_config(out).model.id == "qwen2.5-0.5b-instruct"


def test_a_model_given_twice_is_refused(tmp_path, capsys):
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", *FLAGS, "--model", "gpt2-xl", "--model", "gpt2-xl", "--out", str(out)]) == 2
    assert "--model 'gpt2-xl' is given twice" in capsys.readouterr().err and not out.exists()


def test_the_terminal_takes_several_models(tmp_path, monkeypatch):
    answers = iter(["111122223333", "ap-northeast-2", "gpt2-xl, qwen2.5-0.5b-instruct", "app=444455556666", ""])
    monkeypatch.setattr("sys.stdin", _Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", "--out", str(out)]) == 0
    assert [m.id for m in load_config(out).models] == ["gpt2-xl", "qwen2.5-0.5b-instruct"]


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "fleet.yaml"
    out.write_text("mine\n")
    assert main(["config", "init", *FLAGS, "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err and out.read_text() == "mine\n"
    assert main(["config", "init", *FLAGS, "--out", str(out), "--force"]) == 0
    assert load_config(out).name == "fleetcast"


def test_without_a_terminal_the_flags_must_suffice(tmp_path, capsys):
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", "--account", "111122223333", "--out", str(out)]) == 2
    assert "no terminal to ask on: pass --regions, --consumer" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flag,value,expected", [
    ("--account", "11112222333", "not an AWS account id (12 digits"),
    ("--model", "gpt-17", "choose one of: gpt2-xl"),
    ("--consumer", "Voice App=444455556666", "use NAME=ACCOUNT or NAME=ACCOUNT@REGION"),
])
def test_bad_answers_are_refused_naming_the_flag(tmp_path, capsys, flag, value, expected):
    flags = {"--account": "111122223333", "--regions": "ap-northeast-2", "--consumer": "app=444455556666", flag: value}
    args = [part for pair in flags.items() for part in pair]
    assert main(["config", "init", *args, "--out", str(tmp_path / "f.yaml")]) == 2
    assert expected in capsys.readouterr().err


def test_asks_on_a_terminal(tmp_path, monkeypatch, capsys):
    answers = iter(["111122223333", "ap-northeast-2", "", "not a consumer", "app=444455556666", ""])
    monkeypatch.setattr("sys.stdin", _Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = tmp_path / "fleet.yaml"
    assert main(["config", "init", "--out", str(out)]) == 0
    assert "use NAME=ACCOUNT" in capsys.readouterr().err  # the bad line was refused and asked again
    cfg = load_config(out)
    assert cfg.model.id == "gpt2-xl" and [c.name for c in cfg.consumers] == ["app"]


def test_answers_that_cannot_validate_are_not_written(tmp_path, capsys):
    out = tmp_path / "fleet.yaml"
    # The consumer is the provider account: the generated config is validated first and refused.
    assert main(["config", "init", "--account", "111122223333", "--regions", "ap-northeast-2",
                 "--consumer", "self=111122223333", "--out", str(out)]) == 1
    assert "is the provider account" in capsys.readouterr().err and not out.exists()
    assert not list(tmp_path.iterdir())
