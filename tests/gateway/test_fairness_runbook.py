"""bench/FAIRNESS_DEVICE.md's device call, checked here so that it runs the first time: it fits the `run` tool's
limits (a command of at most 2,000 characters, 600 s per call: /work/.library/device/README.md, "Limits"), parses
as bash, hands scripts.bench_fairness arguments its parser accepts, and its `timeout` ends the bench before the
call's limit."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from fleetcast.config.model import ConsumerAdmission
from scripts.bench_fairness import parse_args, pin_plan

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "bench" / "FAIRNESS_DEVICE.md"
COMMAND_LIMIT = 2000  # characters in one `run` command
CALL_LIMIT_S = 600  # one command's run


def commands() -> list[str]:
    found = re.findall(r"\n    (python3 -m pip install -q --no-index --no-deps --no-compile .*)\n", RUNBOOK.read_text())
    # call 1; call 2 after the first run's fixes; call 3, call 2 at a cap of 4; call 4, call 2 with the TTFT trace
    assert len(found) == 4
    return found


def bench_argv(cmd: str) -> tuple[int, list[str]]:
    """(the timeout's seconds, bench_fairness's arguments) of the call."""
    words = shlex.split(cmd.split("timeout ", 1)[1].split(" > ", 1)[0])
    limit, python, dash_m, module, *argv = words
    assert (python, dash_m, module) == ("python3", "-m", "scripts.bench_fairness")
    return int(limit), argv


@pytest.mark.parametrize("call", [0, 1, 2, 3])
def test_each_device_call_fits_the_run_tools_limits_and_parses_as_bash(call):
    cmd = commands()[call]
    assert len(cmd) <= COMMAND_LIMIT
    assert "--target /tmp/site .whl/*.whl" in cmd and "PYTHONPATH=/tmp/site:$PWD" in cmd  # carry: [".whl"]
    assert subprocess.run(["bash", "-n", "-c", cmd], capture_output=True).returncode == 0


@pytest.mark.parametrize("call", [0, 1, 2, 3])
def test_each_call_runs_the_bench_on_the_gpu_with_three_rounds_and_writes_under_out(call):
    limit, argv = bench_argv(commands()[call])
    assert limit < CALL_LIMIT_S
    args = parse_args(argv)
    assert args.device == "cuda" and args.repeats >= 3 and args.out == "$F"
    assert "F=$OUT/" in commands()[call]
    assert phases_s(args) + 90 < limit


def phases_s(args) -> float:
    """The seconds a run's phases take: per round the capacity, the alone phase and two phases with the neighbour's
    lead, plus one phase first come first served. A run's timeout holds them and 90 s for the start (torch, CUDA
    graphs) and the stop."""
    return args.repeats * (args.capacity_s + 3 * args.seconds + 2 * (args.lead + 1)) + args.seconds + args.lead + 1


def test_the_call_to_repeat_fits_the_run_tools_limits_and_each_run_leaves_room_for_its_phases():
    """Calls 13 to 15's command, the wheels unpacked in the carried `.site/`: two runs of the bench in one call, each
    packed into one archive (at most 8 files come back). Each run's timeout holds its phases, the start and the stop
    (call 15 gave one run 230 s, which cut it in its report), and the runs together fit the call's 600 s."""
    (cmd,) = re.findall(r"\n    (export PYTHONPATH=\$PWD/\.site:\$PWD .*)\n", RUNBOOK.read_text())
    assert len(cmd) <= COMMAND_LIMIT
    assert subprocess.run(["bash", "-n", "-c", cmd], capture_output=True).returncode == 0
    limit, argv = bench_argv(cmd)
    args = parse_args(argv)
    assert args.device == "cuda" and args.repeats >= 3 and args.out == "$F" and args.ttft_trace
    # The config's default, the setting the verdict is about.
    assert args.neighbour_max_queued == ConsumerAdmission.model_fields["max_queued"].default
    loop = re.search(r"for v in ([^;]*); do", cmd)
    assert loop is not None and "tar czf $OUT/$v.tgz -C /tmp $v" in cmd
    assert phases_s(args) + 90 < limit and len(loop.group(1).split()) * limit + 20 <= CALL_LIMIT_S


def test_call_3_is_call_2_at_a_cap_of_4_writing_beside_it():
    """A cap of 4 is the engine's max batch of 4: the gateway's cap is the engine's max_batch_size
    (runtime/gateway/fair.py, admission_caps), so --batch sets both."""
    (_, two), (_, three) = bench_argv(commands()[1]), bench_argv(commands()[2])
    second, third = parse_args(two), parse_args(three)
    assert second.batch == 16 and third.batch == 4
    assert third.skip_off and third.tokens == second.tokens and third.gateway_workers == second.gateway_workers
    assert "F=$OUT/fairness-cap4;" in commands()[2]  # its files beside call 2's, not over them


def test_call_4_is_call_2_with_the_ttft_trace_and_brings_back_its_files_in_one():
    """The `run` tool brings back at most 8 files from $OUT (/work/.library/device/README.md, "Limits"): the bench's
    four and the trace, one file per process, packed into one."""
    (_, two), (limit, four) = bench_argv(commands()[1]), bench_argv(commands()[3])
    second, fourth = parse_args(two), parse_args(four)
    assert fourth.ttft_trace and not second.ttft_trace
    assert (fourth.batch, fourth.seconds, fourth.skip_off, fourth.repeats, limit) == (16, 16, True, 3, 400)
    for name in ("tokens", "lead", "capacity_s", "gateway_workers", "device", "cpu_runs"):
        assert getattr(fourth, name) == getattr(second, name), name
    assert "F=$OUT/fairness-trace;" in commands()[3]
    assert "tar czf $F/trace.tgz -C $F trace && rm -rf $F/trace" in commands()[3]


def test_on_the_device_hosts_sixteen_cores_each_process_gets_cores_of_its_own():
    plan = pin_plan(True, list(range(16)))
    assert plan == {"engine": {0, 1}, "gateway": {2, 3}, "quiet": {4}, "flood": set(range(5, 16))}
    taken = [c for cores in plan.values() for c in cores]
    assert len(taken) == len(set(taken))  # nobody shares a core: the flood cannot take one from the measured


def test_on_two_cores_the_engine_keeps_the_first_and_the_rest_share_the_second():
    assert pin_plan(True, [0, 1]) == {"engine": {0}, "gateway": {1}, "quiet": {1}, "flood": {1}}
    assert pin_plan(False, list(range(16))) == dict.fromkeys(("engine", "gateway", "quiet", "flood"))
    assert pin_plan(True, list(range(16)), {"flood": {9}, "engine": None})["flood"] == {9}
