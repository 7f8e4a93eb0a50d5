"""`fleetcast plan` from the command line: the report, and clear errors naming the argument or field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scripts.cli import main

from .conftest import ROOT, SEED

RESULTS = str(SEED / "results")
# One calibrated candidate, so it wins (g7e fp8 would, but GPT-2 on sm120 is refused: contract/support.py).
FP8_ONLY = str(SEED / "results" / "g6e.xlarge-fp8.json")
SEOUL = str(SEED / "traffic-seoul.yaml")
SLO = ["--ttft-p99-ms", "300", "--itl-p99-ms", "40"]


def plan(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_seed_report_in_the_terminal(capsys):
    code, out, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", "none.yaml", *SLO)
    assert code == 0, err
    lines = out.splitlines()
    first_row = next(ln for ln in lines if ln.startswith("1  "))
    assert "g6e.xlarge [gpt2-xl int8_wo x1]" in first_row and "ap-northeast-2" in first_row and "19.63" in first_row
    assert any(ln.startswith("  ruled out: g7e.2xlarge: not offered in ap-northeast-2") for ln in lines)
    assert ("Recommendation: g6e.xlarge [gpt2-xl int8_wo x1] (synthetic (authored data, not measured)) in "
            "ap-northeast-2") in out


def test_report_files_and_json(capsys, tmp_path):
    code, out, _ = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", "none.yaml", *SLO,
                        "--report", str(tmp_path / "rep"))
    assert code == 0
    rep = tmp_path / "rep"
    names = sorted(p.name for p in rep.iterdir())
    assert names == ["cost_vs_itl-ap-northeast-2.png", "cost_vs_ttft-ap-northeast-2.png", "instances-ap-northeast-2.png",
                     "packing-ap-northeast-2.png", "packing-day-ap-northeast-2.png", "plan.html", "plan.json", "plan.md"]
    md = (rep / "plan.md").read_text()
    assert ("**Recommendation:** g6e.xlarge [gpt2-xl int8_wo x1] (synthetic (authored data, not measured)) in "
            "ap-northeast-2") in md
    assert "### Ruled out" in md and "![cost_vs_itl-ap-northeast-2](cost_vs_itl-ap-northeast-2.png)" in md
    assert "| 09 | 180 | 17 |" in md   # evening peak hour: 17 instances
    page = (rep / "plan.html").read_text()
    assert page.count("data:image/png;base64,") == 5
    data = json.loads((rep / "plan.json").read_text())
    win = data["regions"][0]["winner"]
    assert (win["instance_type"], win["precision"], win["capacity"]) == ("g6e.xlarge", "int8_wo",
                                                                          {"min": 2, "desired": 9, "max": 17})
    for png in rep.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_slo_defaults_come_from_the_config(capsys):
    code, out, _ = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", str(ROOT / "config/fleet.yaml"))
    assert code == 0
    from fleetcast.config import load_config

    slo = load_config(ROOT / "config/fleet.yaml").slo
    assert f"SLO: P99 TTFT <= {slo.ttft_p99_ms:g} ms" in out and f"P99 ITL <= {slo.itl_p99_ms:g} ms" in out


@pytest.mark.parametrize("args, expected", [
    (["--traffic", SEOUL], "--results"),
    (["--results", RESULTS], "--traffic"),
    (["--results", RESULTS, "--traffic", SEOUL, "--ttft-p99-ms", "-5"], "--ttft-p99-ms must be a positive number"),
    (["--results", RESULTS, "--traffic", SEOUL, "--itl-p99-ms", "fast"], "--itl-p99-ms must be a number"),
    (["--results", RESULTS, "--traffic", SEOUL, "--error-rate", "1.5"], "--error-rate must be in [0, 1)"),
    (["--results", RESULTS, "--traffic", SEOUL, "--min-instances", "two"], "--min-instances must be a whole number"),
])
def test_bad_arguments_name_the_flag(capsys, args, expected):
    with pytest.raises(SystemExit) as exc:
        main(["plan", *args])
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err


def _traffic(tmp_path: Path, **changes) -> str:
    doc = {"schema": "fleetcast.traffic/v1", "name": "t", "consumers": [{
        "region": "ap-northeast-2", "rate_rps": {"0-24": 10}, "concurrency": {"1-16": 1.0},
        "input_tokens": 256, "output_tokens": 128}]}
    doc["consumers"][0].update(changes)
    path = tmp_path / "traffic.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("changes, expected", [
    ({"concurrency": {"1-16": 0.5, "32": 0.2}}, "consumers.0.concurrency: concurrency shares must sum to 1, got 0.7000"),
    ({"concurrency": {"16-1": 1.0}}, "consumers.0.concurrency: '16-1': must satisfy 1 <= low <= high <= 4096"),
    ({"rate_rps": {"0-9": 10, "8-24": 5}}, "consumers.0.rate_rps: UTC hour 8 is covered 2 times"),
    ({"rate_rps": [1, 2, 3]}, "consumers.0.rate_rps: give 24 hourly values (UTC 0..23), got 3"),
    ({"output_tokens": 0}, "consumers.0.output_tokens: must be > 0"),
    ({"regoin": "x"}, "consumers.0.regoin: unknown field (typo?)"),
])
def test_bad_traffic_names_the_field(capsys, tmp_path, changes, expected):
    code, _, err = plan(capsys, "--results", RESULTS, "--traffic", _traffic(tmp_path, **changes), "--config", "none.yaml", *SLO)
    assert code == 1
    assert err.startswith("fleetcast plan: --traffic: ") and expected in err
    assert "Traceback" not in err


def _results(tmp_path: Path, **labels) -> str:
    doc = json.loads((SEED / "results" / "g6e.xlarge-int8_wo.json").read_text())
    doc["labels"].update(labels)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("labels, expected", [
    ({"backend": "reference"}, "labels.backend is 'reference' (the development stand-in server); refused as an AWS candidate"),
    ({"instance_type": None}, "labels.instance_type is missing"),
    ({"instance_type": "p5.48xlarge"}, "labels.instance_type 'p5.48xlarge' is not in the instance catalog"),
    ({"precision": "int3"}, "labels.precision 'int3' is not one of"),
])
def test_bad_results_are_refused_with_the_field(capsys, tmp_path, labels, expected):
    code, _, err = plan(capsys, "--results", _results(tmp_path, **labels), "--traffic", SEOUL, "--config", "none.yaml", *SLO)
    assert code == 1 and expected in err and "Traceback" not in err


def test_results_of_the_wrong_schema(capsys, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "aiperf/1"}')
    code, _, err = plan(capsys, "--results", str(bad), "--traffic", SEOUL, "--config", "none.yaml", *SLO)
    assert code == 1 and "schema is 'aiperf/1', expected 'fleetcast.bench/v1'" in err


@pytest.mark.parametrize("flag, text, expected", [
    ("--prices", "prices: {g6e.xlarge: {ap-northeast-2: -1}}", "--prices: {p}: prices.g6e.xlarge.ap-northeast-2 = -1; must be a positive number"),
    ("--prices", "as_of: x", "--prices: {p} must have a `prices:"),
    ("--quality", "schema: fleetcast.quality/v1\nmetric: ppl\nresults: []", "--quality: {p}: threshold: Field required"),
    ("--latency", "rtt_ms: {us-east-1: {us-east-2: fast}}", "--latency: {p}: rtt_ms.us-east-1.us-east-2 = 'fast'"),
    ("--fixed-costs", "as_of: x\nassumptions: {}\nregions: {}", "--fixed-costs: {p}: assumptions.bytes_per_input_token: Field required"),
])
def test_bad_tables_name_the_flag_and_field(capsys, tmp_path, flag, text, expected):
    path = tmp_path / "table.yaml"
    path.write_text(text)
    code, _, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", "none.yaml", *SLO, flag, str(path))
    assert code == 1 and expected.format(p=path) in err, err


def test_missing_config_without_slo_flags(capsys):
    code, _, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", "nope.yaml")
    assert code == 1 and "--config: nope.yaml does not exist" in err and "--ttft-p99-ms" in err


def test_no_candidate_within_the_slo_exits_3(capsys):
    code, out, _ = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", "none.yaml",
                        "--ttft-p99-ms", "10", "--itl-p99-ms", "40")
    assert code == 3
    assert "ap-northeast-2: no packing serves every model within its SLO" in out
    assert "fails the SLO even at its lowest measured load: " in out
    assert "g6e.xlarge [gpt2-xl int8_wo x1]: P99 TTFT 30 ms" in out   # g6e int8_wo at c=1, each candidate's figure


# ---------------------------------------------------------------- --write-config


@pytest.fixture
def fleet(tmp_path) -> Path:
    path = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "config" / "fleet.yaml", path)
    return path


def test_write_config_updates_the_pool_and_keeps_comments(capsys, fleet):
    before = fleet.read_text()
    code, out, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", str(fleet), *SLO,
                          "--min-instances", "1", "--write-config", str(fleet), "--write-spot")
    assert code == 0, err
    after = fleet.read_text()
    from fleetcast.config import load_config

    cfg = load_config(fleet)
    pool = cfg.region("ap-northeast-2").pools[0]
    assert pool.instance_type == "g6e.xlarge" and cfg.engine_for(pool).precision.value == "int8_wo"
    # No fixed desired in the pool: scaling owns the size between the day's lowest and highest.
    assert (pool.capacity.min, pool.capacity.desired, pool.capacity.max) == (2, None, 17)
    assert pool.scaling.target == 48
    # Every comment line survives, and nothing outside the Seoul pool changed.
    comments = [ln for ln in before.splitlines() if ln.strip().startswith("#")]
    assert comments and all(c in after.splitlines() for c in comments)
    # The planner's spot tier (fleetcast/plan/spot.py) is one added line in the Seoul pool.
    spot_lines = [ln for ln in after.splitlines() if ln.strip().startswith("spot:")]
    assert len(spot_lines) == 1 and pool.spot is not None
    kept = [ln for ln in after.splitlines() if ln not in spot_lines]
    changed = [(a, b) for a, b in zip(before.splitlines(), kept) if a != b]
    assert len(before.splitlines()) == len(kept)
    assert all("capacity" in b or "target" in b for _, b in changed), changed
    assert "updated and re-validated" in out


def test_a_calibrated_pick_without_a_staged_set_is_refused_before_writing_naming_the_command(capsys, fleet):
    # Only fp8 measured: g6e fp8 wins, but fp8 is calibrated and the config names no calibration set.
    before = fleet.read_bytes()
    code, out, err = plan(capsys, "--results", FP8_ONLY, "--traffic", str(SEED / "traffic-us-east-1.yaml"),
                          "--config", str(fleet), *SLO, "--write-config", str(fleet))
    assert code == 1
    # The report says it, with the staging command, before the write refuses for the same reason.
    assert "refuses: g6e.xlarge [gpt2-xl fp8 x1] in us-east-1: fp8 is calibrated" in out
    assert "`fleetcast stage calibration --config FILE --dir DIR --name NAME`" in out
    assert "was left untouched" in err and "fleetcast stage calibration" in err and "calibration.dataset" in err
    assert fleet.read_bytes() == before
    assert not (fleet.parent / "fleet.plan-baseline.json").exists()
    assert not [p for p in fleet.parent.iterdir() if p.name.startswith(".")]


def test_a_calibrated_pick_is_written_where_the_config_names_a_staged_set(capsys, fleet):
    fleet.write_text(fleet.read_text().replace("\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:", 1))
    code, out, err = plan(capsys, "--results", FP8_ONLY, "--traffic", str(SEED / "traffic-us-east-1.yaml"),
                          "--config", str(fleet), *SLO, "--write-config", str(fleet))
    assert code == 0, err
    assert "note: g6e.xlarge [gpt2-xl fp8 x1] in us-east-1: fp8 is calibrated" in out and "s3://fleetcast-staging/calibration/lambada/" in out
    from fleetcast.config import load_config

    cfg = load_config(fleet)
    assert cfg.engine_for(cfg.region("us-east-1").pools[0]).precision.value == "fp8"


@pytest.mark.parametrize("example", ["seed/traffic-seoul-arrivals.yaml", "bursty/traffic.yaml",
                                     "long-outputs/traffic.yaml"])
def test_write_config_from_arrivals_writes_the_config_and_a_baseline_the_same_traffic_fits(capsys, fleet, example):
    """The README's recommended method (a profile of arrivals): the config and its drift baseline are both
    written, and checking the traffic the plan was made from finds no drift."""
    fleet.write_text(fleet.read_text().replace("\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:", 1))
    traffic = str(ROOT / "examples" / "plan" / example)
    code, out, err = plan(capsys, "--results", RESULTS, "--traffic", traffic, "--config", str(fleet),
                          "--write-config", str(fleet))
    assert code == 0, err
    assert "updated and re-validated" in out
    baseline = json.loads((fleet.parent / "fleet.plan-baseline.json").read_text())
    (pool,) = baseline["pools"]
    # The planned in-flight mix at arrival comes from the candidate's curve (none is given in the profile).
    assert 0 < pool["share_above_target"] < 1
    (model,) = pool["models"]  # one model: a packing of one (one baseline format)
    assert pool["capacity"]["max"] * model["rps_per_instance"] >= pool["peak_rps"] == model["peak_rps"]
    code, out, _ = plan(capsys, "--results", RESULTS, "--traffic", traffic, "--config", str(fleet), "--check")
    assert code == 0 and "fits the plan" in out, out


def test_a_write_that_fails_leaves_every_file_as_it_was(capsys, fleet):
    # The baseline cannot be written (a directory holds its name): the config must not change either.
    (fleet.parent / "fleet.plan-baseline.json").mkdir()
    before = fleet.read_bytes()
    code, _, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", str(fleet), *SLO,
                        "--min-instances", "1", "--write-config", str(fleet))
    assert code == 1
    assert "cannot write" in err and "left as they were" in err and "Traceback" not in err
    assert fleet.read_bytes() == before
    assert not [p for p in fleet.parent.iterdir() if p.name.startswith(".")]


def test_the_report_promises_the_pooled_fleet_only_where_the_write_does_it(capsys, fleet, tmp_path):
    from .conftest import east_and_west_traffic

    traffic = east_and_west_traffic(tmp_path, '{"0-24": 100}', '{"0-24": 0.5}')
    fleet.write_text(fleet.read_text().replace("\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:", 1))
    args = ["--results", RESULTS, "--traffic", str(traffic), *SLO, "--min-instances", "1"]
    code, out, _ = plan(capsys, *args, "--config", str(fleet), "--write-config", str(fleet))
    assert code == 0 and "Fleet (what --write-config writes):" in out
    # The same fleet, into a config without the us-east-1 region the pool is served from: the write refuses,
    # and the report said so.
    import yaml as pyyaml

    doc = pyyaml.safe_load(fleet.read_text())
    doc["regions"] = [r for r in doc["regions"] if r["region"] != "us-east-1"]
    doc["consumers"] = [c for c in doc["consumers"] if c.get("service_region") != "us-east-1"]
    other = tmp_path / "seoul-only.yaml"
    other.write_text(pyyaml.safe_dump(doc))
    code, out, err = plan(capsys, *args, "--config", str(other), "--write-config", str(other))
    assert code == 1 and "which has no entry under regions" in err
    assert "Fleet (planned; --write-config refuses to write it as the config stands: see below):" in out
    assert "refuses: the plan serves us-east-1, us-west-2 from us-east-1, which has no entry under regions" in out


def test_write_config_refuses_a_region_the_config_lacks(capsys, fleet, tmp_path):
    text = fleet.read_text()
    traffic = tmp_path / "t.yaml"
    traffic.write_text(Path(SEED / "traffic-seoul.yaml").read_text().replace("ap-northeast-2", "us-west-2"))
    code, _, err = plan(capsys, "--results", RESULTS, "--traffic", str(traffic), "--config", str(fleet), *SLO,
                        "--write-config", str(fleet))
    assert code == 1 and "which has no entry under regions" in err
    assert fleet.read_text() == text


def test_two_consumer_regions_plan_and_write_together(capsys, fleet, tmp_path):
    traffic = tmp_path / "two.yaml"
    seoul = (SEED / "traffic-seoul.yaml").read_text()
    east = (SEED / "traffic-us-east-1.yaml").read_text().split("consumers:\n", 1)[1]
    traffic.write_text(seoul + east)
    # Calibrated precisions need a staged dataset: give the config one, whatever the plan picks.
    fleet.write_text(fleet.read_text().replace("\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:", 1)
                     # The Virginia pool fixes its size: the plan keeps that choice, at the day's mean.
                     .replace("capacity: {min: 1, max: 4}", "capacity: {min: 1, desired: 1, max: 4}", 1))
    code, out, err = plan(capsys, "--results", RESULTS, "--traffic", str(traffic), "--config", str(fleet), *SLO,
                          "--min-instances", "1", "--write-config", str(fleet), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "updated and re-validated" in err
    winners = {r["consumer_region"]: (r["winner"]["candidate"], r["winner"]["service_region"]) for r in data["regions"]}
    # g7e fp8 would be cheaper in us-east-1, but the engine flow is refused on its sm120 (contract/support.py).
    assert winners == {"ap-northeast-2": ("g6e.xlarge [gpt2-xl int8_wo x1]", "ap-northeast-2"),
                       "us-east-1": ("g6e.xlarge [gpt2-xl int8_wo x1]", "us-east-1")}
    from fleetcast.config import load_config

    cfg = load_config(fleet)
    east_pool = cfg.region("us-east-1").pools[0]
    assert (east_pool.instance_type, cfg.engine_for(east_pool).precision.value) == ("g6e.xlarge", "int8_wo")
    # g6e int8_wo in us-east-1: 2 to 17 instances by hour, 201 instance-hours a day (mean 8.4 -> desired 9).
    assert (east_pool.capacity.min, east_pool.capacity.desired, east_pool.capacity.max) == (2, 9, 17)
    seoul_capacity = cfg.region("ap-northeast-2").pools[0].capacity
    assert (seoul_capacity.desired, seoul_capacity.max) == (None, 17)


def test_a_cross_region_choice_is_allowed_on_the_service_side(capsys, fleet, tmp_path):
    # Frankfurt consumers; make Frankfurt instances expensive so us-east-1 (RTT 90 ms) wins.
    prices = tmp_path / "prices.yaml"
    prices.write_text('as_of: "2026-02-01"\nprices: {g6e.xlarge: {eu-central-1: 40}, g5.xlarge: {eu-central-1: 40}}\n')
    traffic = tmp_path / "fra.yaml"
    traffic.write_text((SEED / "traffic-seoul.yaml").read_text().replace("ap-northeast-2", "eu-central-1"))
    code, out, err = plan(capsys, "--results", str(SEED / "results" / "g6e.xlarge-int8_wo.json"),
                          str(SEED / "results" / "g5.xlarge-int8_wo.json"), "--traffic", str(traffic),
                          "--config", str(fleet), "--ttft-p99-ms", "400", "--itl-p99-ms", "40", "--prices", str(prices),
                          "--write-config", str(fleet))
    assert "Recommendation: g6e.xlarge [gpt2-xl int8_wo x1] @ us-east-1 (synthetic (authored data, not measured)) in us-east-1" in out, out
    assert code == 0, err
    assert "regions[us-east-1].allowed_regions += eu-central-1" in out
    from fleetcast.config import load_config

    assert "eu-central-1" in load_config(fleet).region("us-east-1").allowed_regions


def test_write_schedule_turns_the_hourly_plan_into_daily_steps(capsys, fleet):
    code, out, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", str(fleet), *SLO,
                          "--min-instances", "1", "--write-config", str(fleet), "--write-schedule")
    assert code == 0, err
    from fleetcast.config import load_config

    pool = load_config(fleet).region("ap-northeast-2").pools[0]
    # 11 instances from 00 UTC, 17 from 09, 2 from 13, 8 from 22 (the seed hand calculation).
    assert [(s.cron, s.min, s.max) for s in pool.schedule] == [
        ("0 0 * * *", 11, 17), ("0 9 * * *", 17, 17), ("0 13 * * *", 2, 17), ("0 22 * * *", 8, 17)]
    assert "- {cron: '0 9 * * *', min: 17, max: 17}" in fleet.read_text()


def test_a_report_that_cannot_be_written_leaves_its_pages_and_the_config(capsys, fleet, tmp_path, unrasterized):
    report = tmp_path / "report"
    report.mkdir()
    (report / "plan.md").write_text("the previous plan\n")
    (report / "plan.json").mkdir()  # plan.json cannot be replaced
    before = fleet.read_bytes()
    code, _, err = plan(capsys, "--results", RESULTS, "--traffic", SEOUL, "--config", str(fleet), *SLO,
                        "--min-instances", "1", "--report", str(report), "--write-config", str(fleet))
    assert code == 1 and "--report: cannot write" in err and "was not written" in err
    assert (report / "plan.md").read_text() == "the previous plan\n"
    assert fleet.read_bytes() == before and not (fleet.parent / "fleet.plan-baseline.json").exists()
