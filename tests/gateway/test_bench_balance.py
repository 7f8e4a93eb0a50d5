"""scripts/bench_balance.py on loopback: two instances of different pool types (gateway and timed engine
processes each), a bursty trace spread evenly over them, balancing off and on. Its figures depend on the
machine's load; what is checked here does not: each request is metered once, by the instance that served it,
forwarding happens only with balancing on, and it goes to the pool that is cheaper per request it holds."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from scripts.bench_balance import main

# Gateways and fake engines as forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = pytest.mark.usefixtures("forked_gateways")


def test_balancing_forwards_only_when_on_to_the_cheaper_pool_per_slot_and_meters_each_request_once(tmp_path, capsys):
    def replay(mode: str) -> dict[str, Any]:
        out = tmp_path / f"balance-{mode}.json"
        assert main(["--seconds", "2", "--modes", mode, "--json", str(out)]) == 0
        return dict(json.loads(out.read_text())[mode])

    # 2 s of trace, inside its first burst (3 s, scripts/bench_balance.py, trace): 27 requests, 13 for the a10g
    # instance's 2 slots, each held at least 0.51 s (its engine's time: a loaded machine only holds it longer). Of
    # those 13, 6 arrive while both slots are held (from the seeded arrival times): 6 requests that balancing on
    # must forward (6 were, in each of 8 runs); the rest of the burst and the lull after it add nothing to
    # what is checked here. Each mode is a run of its own (its processes, ports and event loop) that mostly waits
    # on the trace's clock: side by side the two take the time of one.
    with ThreadPoolExecutor(2) as pool:
        figures = dict(zip(("off", "on"), pool.map(replay, ("off", "on"))))
    printed = capsys.readouterr().out
    assert "cost-weighted utilisation" in printed and "trade-off:" in printed
    for mode in ("off", "on"):
        run = figures[mode]
        assert run["ok"] == run["requests"] == run["metered"] > 0  # every request served and metered once
    assert all(p["forwarded_out"] == 0 for p in figures["off"]["pools"].values())
    pools = figures["on"]["pools"]
    # l40s: 1.861 USD/h for 8 at once; a10g: 1.006 for 2. The a10g instance's overflow goes to the l40s one.
    assert pools["a10g"]["forwarded_out"] > 0


@pytest.mark.parametrize("modes", ["off,x", "", "both"])
def test_modes_other_than_off_and_on_are_refused_naming_the_flag_before_anything_starts(modes, capsys):
    """The same `--modes` for scripts/bench_overflow_replay.py (it imports the parser's type)."""
    from scripts import bench_overflow_replay

    for entry in (main, bench_overflow_replay.main):
        with pytest.raises(SystemExit) as ended:
            entry(["--modes", modes])
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "--modes" in err and "write off, on or off,on" in err and "Traceback" not in err
