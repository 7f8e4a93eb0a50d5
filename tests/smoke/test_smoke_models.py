"""`fleetcast smoke` on a fleet of several models: one completion per model the consumer may call, the
endpoint's list checked against the config, and every model the consumer may not call (and an id no
config holds) refused with the gateway's 404 model_not_found. Against fleetcast.bench.testserver on
loopback, which lists the models it serves and answers any other id as the gateway does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetcast.bench.accuracy import TestServerProcess
from fleetcast.bench.testserver import Timings
from fleetcast.smoke import REFUSED, UNKNOWN_MODEL
from tests.bench.conftest import free_port
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
# voice-app may call gpt2-xl, qwen2.5-0.5b and qwen2.5-3b; analytics the first two only.
CONFIG = ROOT / "examples" / "multi-model" / "fleet.yaml"


def cli(*args):
    """`fleetcast smoke` in this process (tests/cli.py): fourteen interpreters importing the CLI cost 16 s of CPU."""
    return run_cli("smoke", *args)


def _server(*models: str) -> TestServerProcess:
    return TestServerProcess(free_port(), Timings(ttft_ms=2, itl_ms=1, models=tuple((m, 2.0, 1.0) for m in models)))


@pytest.fixture(scope="module")
def analytics_view():
    """What analytics' endpoint shows: the two models it may call."""
    with _server("gpt2-xl", "qwen2.5-0.5b") as server:
        yield server


def test_every_model_the_consumer_may_call_answers_and_the_others_are_refused(analytics_view):
    out = cli("--endpoint", analytics_view.url, "--config", str(CONFIG), "--consumer", "analytics",
              "--max-tokens", "5", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [r["model"] for r in report["models"]] == ["gpt2-xl", "qwen2.5-0.5b"]
    assert all(r["completion_tokens"] == 5 and 0 < r["ttft_ms"] <= r["e2e_ms"] for r in report["models"])
    assert report["refused"] == {"qwen2.5-3b": REFUSED, UNKNOWN_MODEL: REFUSED} and report["failures"] == []
    human = cli("--endpoint", analytics_view.url, "--config", str(CONFIG), "--consumer", "analytics")
    assert human.returncode == 0
    assert "  gpt2-xl: TTFT" in human.stdout and "refused: qwen2.5-3b (404 model_not_found)" in human.stdout


def test_a_model_missing_behind_the_endpoint_fails_by_name(analytics_view):
    # voice-app may also call qwen2.5-3b: an endpoint that does not list it is not voice-app's whole fleet.
    out = cli("--endpoint", analytics_view.url, "--config", str(CONFIG), "--consumer", "voice-app")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "GET /v1/models does not list qwen2.5-3b, which consumer voice-app may call" in out.stderr
    assert "  gpt2-xl: TTFT" in out.stdout  # what did answer is still reported


def test_a_leaked_entitlement_fails_by_name():
    with _server("gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b") as leaky:
        out = cli("--endpoint", leaky.url, "--config", str(CONFIG), "--consumer", "analytics")
    assert out.returncode == 1
    assert "GET /v1/models lists qwen2.5-3b, which consumer analytics may not call" in out.stderr
    assert ("qwen2.5-3b answered 200 no error code; consumer analytics may not call it, so the gateway must answer "
            "404 model_not_found") in out.stderr


def test_without_a_config_every_listed_model_gets_a_completion(analytics_view):
    out = cli("--endpoint", analytics_view.url + "/v1", "--max-tokens", "3", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [r["model"] for r in report["models"]] == ["gpt2-xl", "qwen2.5-0.5b"] and report["refused"] == {}
    one = cli("--endpoint", analytics_view.url, "--model", "qwen2.5-0.5b", "--max-tokens", "3", "--json")
    assert json.loads(one.stdout)["model"] == "qwen2.5-0.5b"  # --model: that model alone, the one-model output


@pytest.mark.parametrize("args, said", [
    (["--consumer", "analytics"], "--consumer goes with --config"),
    (["--config", str(CONFIG)], "--consumer is needed: the config has 2 consumers (voice-app, analytics)"),
    (["--config", str(CONFIG), "--consumer", "nobody"], "--consumer 'nobody' is not a consumer of the config"),
    (["--config", str(CONFIG), "--consumer", "analytics", "--model", "gpt2-xl"], "--model and --config exclude"),
])
def test_bad_arguments_are_one_line(args, said):
    out = cli("--endpoint", "http://127.0.0.1:9", *args)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr
