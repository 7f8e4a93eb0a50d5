"""The KV budget a packing plan writes into the config (docs/plan.md, `--write-config`: "GiB rounded down
to 0.1 so the memory sum still fits") and shows in its report: one rounding for both."""

from __future__ import annotations

from datetime import date

import pytest

from fleetcast.config import load_config
from fleetcast.config.memory import GIB
from fleetcast.plan.packing import kv_gib_written
from fleetcast.plan.packing_report import model_rows
from fleetcast.plan.run import PlanOptions, build_packing
from fleetcast.plan.writeback import compute_packing_edit

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"


@pytest.mark.parametrize("gib", [0.1, 0.7, 2.3, 4.6, 6.0, 11.4, 20.0])
def test_a_budget_on_the_tenth_grid_survives_the_round_trip_through_bytes(gib):
    """A measured packing's budget is held in whole bytes (config/model.py: int(kv_cache_gb x 2^30)); read
    back, 2.3 GiB is 2.2999999994 GiB, and a plain floor to 0.1 would write 2.2."""
    assert kv_gib_written(int(gib * GIB) / GIB) == gib


def test_a_budget_between_tenths_is_rounded_down():
    assert kv_gib_written(11.46) == 11.4
    assert kv_gib_written(11.4999) == 11.4


def _plan():
    opts = PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(EXAMPLE / "traffic.yaml"),
                       config=str(EXAMPLE / "fleet.yaml"), today=date(2026, 2, 1))
    return build_packing(opts)[0]


def test_the_written_budget_is_the_one_measured(tmp_path):
    """A co-located measurement at 2.3 GiB each: the config gets 2.3, what the measurement ran."""
    result = _plan()
    winner = result.regions[0].winner
    for m in winner.loads:
        m.kv_gib = int(2.3 * GIB) / GIB
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLE / "fleet.yaml").read_text())
    edit = compute_packing_edit(fleet, result, allow_estimated=True)
    fleet.write_text(edit.text)
    (pool,) = load_config(fleet).regions[0].pools
    assert [s.kv_cache_gb for s in pool.serves] == [2.3] * len(winner.loads)


def test_the_report_shows_the_budget_the_config_gets(tmp_path):
    """The example's even share is 11.45.. GiB: the report's column and the written config both say 11.4."""
    result = _plan()
    winner = result.regions[0].winner
    header, rows = model_rows(winner)
    column = header.index("KV GiB each")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLE / "fleet.yaml").read_text())
    fleet.write_text(compute_packing_edit(fleet, result, allow_estimated=True).text)
    (pool,) = load_config(fleet).regions[0].pools
    assert [row[column] for row in rows] == [f"{s.kv_cache_gb:.1f}" for s in pool.serves]
