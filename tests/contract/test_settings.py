"""Every instance setting has one type and one default (fleetcast/contract/instance_env.py SETTINGS), and each
hop a setting travels (instance env file -> bootstrap -> serve settings -> the gateway's command line -> its
argparse) takes that default instead of restating it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcast.contract.bench import (
    CONCURRENCY,
    ENDPOINT,
    INPUT_TOKENS,
    KNOB_DEFAULTS,
    OUTPUT_TOKENS,
    REQUESTS_PER_LEVEL,
)
from fleetcast.contract.context import Context, is_true
from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import SETTINGS, Var, default, setting
from runtime.bootstrap import InstanceEnv
from runtime.engine_cache import CacheSettings
from runtime.gateway.__main__ import build_parser
from runtime.serve import ServeSettings, Serving
from runtime.supervisor import RestartPolicy

BASE = {Var.FLEET.value: "f", Var.REGION.value: "us-east-1", Var.POOL.value: "p", Var.BUCKET.value: "b",
        Var.CONFIG_PARAM.value: "/f/config"}


def test_an_unset_environment_gives_every_default_and_the_hops_agree():
    env = InstanceEnv.from_environ(BASE)
    assert env.gateway_refresh_s == default(Var.GATEWAY_REFRESH_S) == 60.0
    assert env.upstream_idle_s == default(Var.UPSTREAM_IDLE_S) == 120.0
    assert env.cache == CacheSettings()  # the engine cache's own defaults are the table's
    assert env.restart == RestartPolicy()
    assert (env.liveness_interval_s, env.liveness_timeout_s, env.liveness_failures, env.replace_wait_s) == (
        default(Var.LIVENESS_INTERVAL_S), default(Var.LIVENESS_TIMEOUT_S), default(Var.LIVENESS_FAILURES),
        default(Var.REPLACE_WAIT_S))
    settings = ServeSettings(port=8000, model_name="m", region="us-east-1", pool="p")
    assert (settings.gateway_refresh_s, settings.upstream_idle_timeout_s) == (env.gateway_refresh_s, env.upstream_idle_s)
    argv = Serving(settings, ["server"]).gateway_argv()[3:]  # after `python -m runtime.gateway`
    parsed = build_parser().parse_args(argv)
    defaults = build_parser().parse_args(["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2",
                                          "--region", "r", "--pool", "p"])
    assert parsed.refresh_s == defaults.refresh_s == default(Var.GATEWAY_REFRESH_S)
    assert parsed.upstream_idle_s == defaults.upstream_idle_s == default(Var.UPSTREAM_IDLE_S)
    assert defaults.proxy_protocol == default(Var.GATEWAY_PROXY_PROTOCOL)


def test_a_set_variable_reaches_the_gateway_command_line():
    env = InstanceEnv.from_environ({**BASE, Var.GATEWAY_REFRESH_S.value: "15", Var.UPSTREAM_IDLE_S.value: "45"})
    settings = ServeSettings(port=8000, model_name="m", region="r", pool="p", gateway_refresh_s=env.gateway_refresh_s,
                             upstream_idle_timeout_s=env.upstream_idle_s)
    parsed = build_parser().parse_args(Serving(settings, ["server"]).gateway_argv()[3:])
    assert (parsed.refresh_s, parsed.upstream_idle_s) == (15.0, 45.0)


@pytest.mark.parametrize("var, raw, message", [
    (Var.GATEWAY_REFRESH_S, "0", "must be a number > 0"),
    (Var.LIVENESS_FAILURES, "-1", "must be a number > 0"),
    (Var.POLL_S, "soon", "is not a number"),
    (Var.PORT, "eighty", "is not a number"),
])
def test_a_bad_value_is_refused_naming_the_variable(var, raw, message):
    with pytest.raises(UserError) as refused:
        InstanceEnv.from_environ({**BASE, var.value: raw})
    assert str(refused.value).startswith(f"{var.value}: {raw!r}") and message in str(refused.value)


def test_setting_types_are_what_the_runtime_reads():
    assert setting({Var.MAX_RESTARTS.value: "7"}, Var.MAX_RESTARTS) == 7
    assert isinstance(setting({}, Var.LIVENESS_FAILURES), int)
    assert setting({Var.POLL_S.value: ""}, Var.POLL_S) == default(Var.POLL_S)  # empty: the default
    assert setting({Var.LISTEN_HOST.value: "127.0.0.1"}, Var.LISTEN_HOST) == "127.0.0.1"
    for var, spec in SETTINGS.items():
        assert spec.default is None or isinstance(spec.default, spec.kind), var
        assert not spec.positive or spec.default > 0, var


def test_the_bench_job_and_the_bench_stacks_share_their_defaults():
    from fleetcast.bench.job import bench_argv

    argv = bench_argv({}, out=Path("/tmp/r.json"))
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["--endpoint"] == ENDPOINT
    assert pairs["--concurrency"] == KNOB_DEFAULTS[Context.BENCH_CONCURRENCY] == CONCURRENCY
    assert pairs["--requests-per-level"] == KNOB_DEFAULTS[Context.BENCH_REQUESTS] == REQUESTS_PER_LEVEL
    assert pairs["--input-tokens"] == KNOB_DEFAULTS[Context.BENCH_INPUT_TOKENS] == INPUT_TOKENS
    assert pairs["--output-tokens"] == KNOB_DEFAULTS[Context.BENCH_OUTPUT_TOKENS] == OUTPUT_TOKENS


@pytest.mark.parametrize("value, expected", [
    (None, False), ("true", True), ("True", True), ("1", True), ("yes", True), (True, True),
    ("false", False), ("0", False), (False, False), ("", False),
])
def test_a_boolean_context_value(value, expected):
    assert is_true(value) is expected
    assert is_true(None, default=True) is True
