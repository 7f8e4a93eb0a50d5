"""scripts/bench_fairness.py and bench_gateway's fair-admission line: what they set up and what they print
(the measurements themselves are load-dependent, so they are printed, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcast.config import parse_config
from runtime.gateway.fair import admission_caps
from scripts.bench_fairness import NEIGHBOUR, QUIET, fairness_config
from scripts.bench_gateway import POOL, REGION, fair_admission_cpu


def test_the_fairness_bench_serves_two_accounts_from_one_engine_capped_at_its_batch():
    cfg = parse_config(fairness_config(8), "<test>")
    assert admission_caps(cfg, cfg.region(REGION).pool(POOL)) == {cfg.models[0].id: 8}
    served = {c.name: c.account for c in cfg.consumers_of(REGION)}
    assert served == {QUIET[0]: QUIET[1], NEIGHBOUR[0]: NEIGHBOUR[1]}
    # Limits and queues far above the load: only the admission order decides who waits.
    assert all(c.limits.max_concurrency == 10000 and c.admission.max_queued == 10000 for c in cfg.consumers)


def test_the_quiet_weight_sets_the_quiet_accounts_part_of_the_cap():
    from runtime.gateway.fair import reserved

    cfg = parse_config(fairness_config(16, quiet_weight=3.0), "<test>")
    weights = {c.name: c.admission.weight for c in cfg.consumers}
    assert weights == {QUIET[0]: 3.0, NEIGHBOUR[0]: 1.0}
    assert (reserved(16, 3.0, 4.0), reserved(16, 1.0, 4.0)) == (12, 4)


def test_the_neighbours_max_queued_is_the_configs_field_and_a_bad_value_is_one_line_naming_the_flag(capsys):
    """--neighbour-max-queued sets consumers[].admission.max_queued of the neighbour alone (the quiet account's stays
    at the most, so it never gets a 429); its bounds are the config's, and a value past them is refused naming the
    flag, without a traceback."""
    from scripts.bench_fairness import parse_args

    cfg = parse_config(fairness_config(16, neighbour_max_queued=64), "<test>")
    assert {c.name: c.admission.max_queued for c in cfg.consumers} == {QUIET[0]: 10000, NEIGHBOUR[0]: 64}
    assert parse_args(["--neighbour-max-queued", "64"]).neighbour_max_queued == 64
    for bad in ("-1", "10001"):
        with pytest.raises(SystemExit):
            parse_args(["--neighbour-max-queued", bad])
        err = capsys.readouterr().err
        assert f"--neighbour-max-queued {bad}:" in err and "Traceback" not in err


def test_the_neighbours_output_tokens_may_be_drawn_from_a_range_and_a_bad_range_names_the_flag(capsys):
    """--flood-tokens LO-HI draws each of the neighbour's requests' max_tokens from LO to HI (its streams then end
    apart, as real traffic's do); without it every request asks --tokens. A range that is not 1 <= LO <= HI is one
    line naming the flag."""
    from scripts.bench_fairness import parse_args, token_range

    assert parse_args([]).flood_tokens is None
    assert parse_args(["--flood-tokens", "32-96"]).flood_tokens == (32, 96)
    assert token_range("64") == (64, 64)
    for bad in ("96-32", "0-8", "a-b", "3-"):
        with pytest.raises(SystemExit):
            parse_args(["--flood-tokens", bad])
        err = capsys.readouterr().err
        assert "--flood-tokens" in err and "LO" in err and "Traceback" not in err


def test_the_simulations_arguments_are_checked_and_help_is_printed_without_a_traceback(capsys):
    from scripts.bench_fairness import main, parse_simulate_args

    assert parse_simulate_args(["16", "--seconds=20", "--prefill-ms=2.5"]).caps == [16]
    assert parse_simulate_args(["--seeds", "6", "--flood-tokens", "32-96"]).flood_tokens == (32, 96)
    with pytest.raises(SystemExit) as ended:
        main(["simulate", "--help"])
    assert ended.value.code == 0 and "--prefill-ms" in capsys.readouterr().out
    for bad in (["x"], ["0"], ["16", "--seconds=0"], ["16", "--bogus"], ["--seeds", "0"], ["--flood-tokens", "9-3"]):
        with pytest.raises(SystemExit) as ended:
            main(["simulate", *bad])
        assert ended.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_the_simulations_drawn_flood_lengths_leave_its_arrivals_as_they_were():
    """Lengths come from a random stream of their own: a range of one length is the run without a range, whatever
    the seed, and a wider range changes what the engine serves, not who arrives when."""
    import asyncio

    from scripts.bench_fairness import simulated_waits

    plain = asyncio.run(simulated_waits(16, 1, seconds=2.0, seed=3))
    assert asyncio.run(simulated_waits(16, 1, seconds=2.0, seed=3, flood_tokens=(64, 64))) == plain
    drawn = asyncio.run(simulated_waits(16, 1, seconds=2.0, seed=3, flood_tokens=(8, 120)))
    assert drawn["quiet_requests"] == plain["quiet_requests"]
    assert drawn["neighbour_served"] != plain["neighbour_served"]


def test_bench_gateway_prints_fair_admissions_cpu_only_against_a_run_with_it_off():
    levels = {16: {"gateway": {"cpu_ms_per_request": 0.210}, "gateway-alt": {"cpu_ms_per_request": 0.195}}}
    on = fair_admission_cpu({"config": {"alt_arg": ["--fair-admission=off"]}, "levels": levels})
    assert on[1] == "  c=16: +0.015 (0.210 on, 0.195 off)"
    assert fair_admission_cpu({"config": {"alt_arg": ["--workers=2"]}, "levels": levels}) == []


def test_bench_gateways_config_sets_a_cap_its_levels_never_reach():
    from scripts.bench_gateway import bench_config_data

    cfg = parse_config(bench_config_data(), "<test>")
    caps = admission_caps(cfg, cfg.region(REGION).pool(POOL))
    assert min(caps.values()) >= 2 * 128  # far above its busiest level: it times the hop, not a queue


def test_bench_gateway_prints_fair_admissions_cpu_per_request_against_the_bound():
    from scripts.bench_gateway import fair_admission_cpu_lines

    cpu = {"runs": 7, "requests_per_run": 10000, "room": {"min": 17.7, "median": 18.1, "max": 18.9},
           "queued": {"min": 65.4, "median": 68.5, "max": 81.7}}
    lines = fair_admission_cpu_lines(cpu)
    assert "7 runs of 10000" in lines[0] and "bound 50" in lines[0]
    assert lines[1] == "  finds room: 17.7 / 18.1 / 18.9  within the bound"
    assert lines[2] == "  waits, then is handed the slot: 65.4 / 68.5 / 81.7  ABOVE THE BOUND"


def test_fair_admissions_cpu_is_measured_on_both_paths_with_a_spread():
    """A real measurement (a few runs of a few requests: the figures are not asserted, their shape is)."""
    from scripts.bench_gateway import fair_admission_cpu_runs

    cpu = fair_admission_cpu_runs(runs=2, n=200)
    assert cpu["runs"] == 2 and cpu["requests_per_run"] == 200
    for path in ("room", "queued"):
        assert cpu[path]["min"] <= cpu[path]["median"] <= cpu[path]["max"]


def test_bench_fairness_reports_the_pooled_p99_ratio_and_each_rounds_spread():
    import argparse

    from scripts.bench_fairness import report_lines, spread, verdict

    def figures(p99: float) -> dict:
        return {"ttft_p50": 10.0, "ttft_p90": 20.0, "ttft_p99": p99, "ok": 300}

    results = {"capacity_rps": [20.0, 18.0], "rounds": [{}, {}], "pinned": {"engine": [0]},
               "pooled": {"alone": figures(100.0), "engine_bound": figures(105.0), "fair": figures(120.0)},
               "pooled_ratio": {"engine_bound": 1.05, "fair": 1.2},
               "round_ratios": {"engine_bound": spread([1.1, 1.0]), "fair": spread([1.3, 1.1])},
               "admission_cpu_us": {"runs": 7, "requests_per_run": 10000, "room": {"min": 1, "median": 2, "max": 3},
                                    "queued": {"min": 4, "median": 5, "max": 6}}}
    results["verdict"] = verdict(results)
    args = argparse.Namespace(batch=8, quiet_share=0.15, seconds=40.0, flood=3.0)
    lines = report_lines(results, args)
    text = "\n".join(lines)
    assert "beside a neighbour at 3 R, fair admission: 10.0 / 20.0 / 120.0 (1.2x alone), 300 samples" in text
    assert "per-round P99 ratio, fair: min 1.1x, median 1.2x, max 1.3x" in text
    assert "first come first served" not in text  # --skip-off: no such phase
    assert "engine [0], gateway any" in text  # the cores each role had
    assert lines[-1] == ("fairness: FAIL: quiet P99 TTFT beside a neighbour at 3 R is 1.2x its P99 alone (pooled; "
                         "bound 1.1x; rounds 1.1-1.3x, median 1.2x; engine-bound floor 1.05x)")


def test_the_verdict_passes_at_the_issues_bound_and_fails_above_it():
    from scripts.bench_fairness import spread, verdict

    def results(fair: float) -> dict:
        return {"pooled_ratio": {"fair": fair, "engine_bound": 1.0},
                "round_ratios": {"fair": spread([fair]), "engine_bound": spread([1.0])}}

    assert verdict(results(1.1))["pass"] and not verdict(results(1.11))["pass"]


def _run_with_results(directory, rounds: int, samples: dict) -> None:
    import json

    directory.mkdir()
    (directory / "fairness.json").write_text(json.dumps({"rounds": [{}] * rounds, "quiet_samples": samples}))


def _run_with_a_client_trace_only(directory, samples: dict) -> None:
    """As a run cut short after its rounds leaves it: no fairness.json, the client's trace gzipped (as committed)."""
    import gzip
    import json

    (directory / "trace").mkdir(parents=True)
    lines = [json.dumps({"kind": "lag_second", "at": 1.0, "max_ms": 0.3, "role": "client"})]
    for name, rows in samples.items():
        lines += [json.dumps({"kind": "client", "id": f"r{1 + n % 2}-{name}-{n}", "status": status, "ttft_ms": ttft,
                              "role": "client"}) for n, (status, ttft) in enumerate(rows)]
    lines.append('{"kind": "client", "id": "r1-fa')  # a line cut by a killed process is passed over
    (directory / "trace" / "client-7.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))


def test_pool_gives_the_verdict_over_every_runs_samples_together_not_over_their_ratios(tmp_path, capsys):
    """Two runs of 100 samples a phase: the first's fair P99 1.3x its alone (FAIL alone), the second's 0.8x. Pooled,
    the P99 is that of the 200 samples together (the percentile the bench uses), here within the bound."""
    from scripts.bench_fairness import main, percentile

    def ms(base: float, tail: float) -> list:
        return [[200, base + i / 100] for i in range(98)] + [[200, tail], [200, tail]]

    first = {"alone": ms(4.0, 10.0), "engine_bound": ms(4.0, 20.0), "fair": ms(4.0, 13.0)}
    second = {"alone": ms(4.0, 10.0), "engine_bound": ms(4.0, 20.0), "fair": ms(4.0, 8.0) + [[429, None]]}
    _run_with_results(tmp_path / "a", 3, first)
    _run_with_a_client_trace_only(tmp_path / "b", second)
    png = tmp_path / "pooled.png"
    assert main(["pool", str(tmp_path / "a"), str(tmp_path / "b"), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out.splitlines()
    assert out[3] == f"drew {png}"
    del out[3]
    assert out[0] == f"{tmp_path / 'a'} (3 rounds): alone P99 10.0 ms (100 samples), engine_bound P99 20.0 ms (2.0x), " \
                     "fair P99 13.0 ms (1.3x)"
    assert out[1].startswith(f"{tmp_path / 'b'} (2 rounds): ") and "fair P99 8.0 ms (0.8x)" in out[1]
    fair = round(percentile([t for s, t in first["fair"] + second["fair"] if s == 200], 0.99), 2)
    assert out[2] == f"pooled over 2 runs (5 rounds, 200 samples a phase): alone P99 10.0 ms, engine_bound P99 " \
                     f"20.0 ms (2.0x), fair P99 {fair} ms ({round(fair / 10.0, 2)}x)"
    assert fair / 10.0 <= 1.1
    assert out[3] == (f"fairness: PASS: quiet P99 TTFT beside the neighbour is {round(fair / 10.0, 2)}x its P99 "
                      f"alone (pooled over 2 runs; bound 1.1x; runs 0.8-1.3x, median 1.05x; engine-bound floor 2.0x)")


def test_pool_names_the_run_it_cannot_read_and_prints_no_traceback(tmp_path, capsys):
    from scripts.bench_fairness import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "fairness.json").write_text('{"quiet_samples": {"alone": [[200, 4.0]]')
    (tmp_path / "bad-id" / "trace").mkdir(parents=True)
    (tmp_path / "bad-id" / "trace" / "client-1.jsonl").write_text('{"kind": "client", "id": "x", "ttft_ms": 1}\n')
    for run, says in (("empty", "no quiet samples of the alone and fair phases"),
                      ("broken", "not a fairness.json this bench wrote"),
                      ("bad-id", "is not r<round>-<phase>-<n>")):
        with pytest.raises(SystemExit) as stopped:
            main(["pool", str(tmp_path / run)])
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert str(tmp_path / run) in err and says in err and "Traceback" not in err


def test_pool_names_the_picture_it_cannot_write(tmp_path, capsys):
    from scripts.bench_fairness import main

    samples = {"alone": [[200, 4.0]] * 10, "engine_bound": [[200, 5.0]] * 10, "fair": [[200, 4.0]] * 10}
    _run_with_results(tmp_path / "a", 1, samples)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as stopped:
        main(["pool", str(tmp_path / "a"), "--png", str(tmp_path / "a-file" / "pooled.png")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"--png {tmp_path / 'a-file' / 'pooled.png'}: cannot write it" in err and "Traceback" not in err

def test_a_picture_whose_write_fails_midway_leaves_the_one_before_whole(tmp_path, capsys, monkeypatch):
    """The disk fills while matplotlib writes: the earlier picture stays as it was, and no part of the new one."""
    import matplotlib.figure

    from scripts.bench_fairness import main

    samples = {"alone": [[200, 4.0]] * 10, "engine_bound": [[200, 5.0]] * 10, "fair": [[200, 4.0]] * 10}
    _run_with_results(tmp_path / "a", 1, samples)
    png = tmp_path / "pooled.png"
    png.write_bytes(b"the picture before")

    def half_written(self, path, **kw):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_written)
    with pytest.raises(SystemExit):
        main(["pool", str(tmp_path / "a"), "--png", str(png)])
    assert f"--png {png}: cannot write it (No space left on device)" in capsys.readouterr().err
    assert png.read_bytes() == b"the picture before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "pooled.png"]


@pytest.fixture(scope="module")
def steady() -> dict:
    """The simulation without a stall or a prefill, 4 s after a 1 s lead: the tests that read it run it once (2 to
    5 s of CPU a run). It is deterministic (virtual time), so sharing it changes no figure."""
    import asyncio

    from scripts.bench_fairness import simulated_waits

    return asyncio.run(simulated_waits(16, workers=2, seconds=4.0, lead=1.0))


def test_beside_a_flood_through_two_workers_a_quiet_account_within_its_part_never_waits_for_a_slot(steady):
    """The admission code before a simulated engine in virtual time (`simulated_waits`: deterministic, whatever the
    machine's load), as the device run has it: a cap of 16, two gateway workers, the neighbour at 3x the engine's
    capacity, the quiet account at 0.15x, requests of 64 tokens that free their slots in bunches. Once the
    neighbour's requests from before the quiet account came have ended, no quiet request waits, and the neighbour
    never holds more than the cap less the quiet account's part. Before, with two workers, the neighbour held 10
    beside the quiet account and quiet requests waited up to 17 ms (a request passing its own account's queue in
    one worker while the other had yet to read its poke; tests/gateway/test_fair.py). Read over the 4 s run that
    the stalled engine's test compares with, not a 2 s run of its own: twice the seconds, so twice the 2 s run's
    bound of 40 quiet requests (it had 61; the 4 s run has 151)."""
    from runtime.gateway.fair import held_beside

    row = steady
    assert row["quiet_requests"] >= 80 and row["waited_later"] == 0
    assert row["neighbour_most_held"] == held_beside(16, [1.0, 1.0]) == 8


def test_the_engines_figures_say_whether_its_longest_queue_was_spent_in_the_step_before_or_between_steps():
    """bench/FAIRNESS_DEVICE.md: the engine's queue reached 20-64 ms beside the neighbour at a 0.6-0.9 ms mean step.
    Its iteration stats (runtime/reference/engine.py, trtllm-serve's fields) time each step and the admitted
    requests' mean wait; the bench now says which step was longest and how long the step before the longest wait
    took, so a device run tells a long step (a prefill, a delivery, a pause inside it) from a gap between steps."""
    from scripts.bench_fairness import engine_figures

    def step(ms: float, active: int, new: int = 0, queue_ms: float = 0.0, done: int = 0) -> dict:
        return {"iterLatencyMS": ms, "numActiveRequests": active, "numNewActiveRequests": new,
                "newActiveRequestsQueueLatencyMS": queue_ms, "numCompletedRequests": done, "numQueuedRequests": 0}

    in_a_step = engine_figures([step(0.6, 2), step(41.0, 10, new=8, done=8), step(0.7, 11, new=1, queue_ms=40.2),
                                step(0.6, 11)])
    assert in_a_step["max_engine_queue_ms"] == 40.2 and in_a_step["before_max_queue_ms"] == 41.0
    assert (in_a_step["max_step_ms"], in_a_step["max_step_admitted"], in_a_step["max_step_completed"]) == (41.0, 8, 8)
    assert in_a_step["steps_over_5ms"] == 1 and in_a_step["steps"] == 4
    between = engine_figures([step(0.6, 10), step(0.8, 10), step(0.7, 11, new=1, queue_ms=35.0)])
    assert between["max_engine_queue_ms"] == 35.0 and between["before_max_queue_ms"] == 0.8
    assert between["max_step_ms"] == 0.8 and between["steps_over_5ms"] == 0
    assert engine_figures([])["before_max_queue_ms"] is None


def test_when_the_engine_stalls_the_quiet_accounts_bursts_find_the_room_its_recent_peak_kept(steady):
    """bench/FAIRNESS_DEVICE.md: at a cap of 16 the quiet account waited at the gateway (P99 19-32 ms) beside a
    neighbour held to 8, while its engine's queue reached 20-64 ms. In the simulation with the engine stopping 100 ms
    every 0.5 s (`stall_ms`), with the parts alone, every quiet request that waited once the neighbour's earlier
    requests had ended found its own account at its whole part (8 of 16): its own part filling up while the engine
    stood still. With its recent peak in flight and a quarter more reserved beside the flood (runtime/gateway/fair.py,
    BURST_HEADROOM), none waits after the phase's start, stalled or not, and the neighbour never holds more than 8."""
    import asyncio

    from scripts.bench_fairness import simulated_waits

    stalled = asyncio.run(simulated_waits(16, workers=2, seconds=4.0, lead=1.0, stall_ms=100.0))
    assert stalled["waited"] >= 1 and stalled["waited_later"] == 0  # the phase's start: the flood held the cap
    assert stalled["neighbour_most_held"] == 8
    assert steady["waited_later"] == 0 and steady["quiet_least_own_when_waiting"] is None


def test_with_each_admission_paying_its_prefill_only_a_burst_past_the_quiet_accounts_recent_peak_waits_at_its_part():
    """The device's iterations that admit a request run 2-8 ms longer (its prefill; bench/FAIRNESS_DEVICE.md call 4),
    so a burst of the quiet account stretches its own requests' time and fills its part (8 of 16) while the
    neighbour holds the rest: in the simulation with a prefill of 2.5 ms an admission, with the part alone, 5 of its
    7 waits came at its whole part (`quiet_own_when_waiting`: how many requests it held or waited for at each). With
    its recent peak reserved beside the flood (runtime/gateway/fair.py), only the first burst past its part waits
    there: the next ones of that size find the room kept. The weights still move the part itself."""
    import asyncio

    from scripts.bench_fairness import simulated_waits

    row = asyncio.run(simulated_waits(16, workers=2, seconds=4.0, lead=1.0, prefill_ms=2.5))
    assert sum(row["quiet_own_when_waiting"].values()) == row["waited"]
    assert row["quiet_own_when_waiting"].get(8, 0) <= 1 and max(row["quiet_own_when_waiting"]) <= 8
    assert row["neighbour_most_held"] == 8
    # The same seconds with the quiet account weighted 3 to 1 (its part 12, the neighbour held to 4): none of its
    # waits comes at its part; what is left is the start, the neighbour's excess from when it was alone ending.
    heavier = asyncio.run(simulated_waits(16, workers=2, seconds=4.0, lead=1.0, prefill_ms=2.5, quiet_weight=3.0))
    assert heavier["neighbour_most_held"] == 4 and max(heavier["quiet_own_when_waiting"]) < 12


def test_the_results_of_a_run_with_cores_given_are_written_as_json():
    """The H100 calls with --engine-cpus and the like ended in a TypeError after the report (a set of cores in the
    results' `config`), so they wrote no fairness.json and exited 1 whatever the verdict."""
    import json

    from scripts.bench_fairness import parse_args, results_json

    args = parse_args(["--engine-cpus", "0-3", "--flood-cpus", "7,9", "--out", "/tmp/x"])
    written = json.loads(results_json({"config": vars(args), "verdict": {"pass": True}}))
    assert written["config"]["engine_cpus"] == [0, 1, 2, 3] and written["config"]["flood_cpus"] == [7, 9]
