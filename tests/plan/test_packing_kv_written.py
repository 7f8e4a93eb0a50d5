"""The KV budget and scaling target a packing plan writes into the config (docs/plan.md, `--write-config`: "GiB
rounded down to 0.1 so the memory sum still fits") and shows in its report: one rounding for all of them
(solver.floor_tenth, which solver.scaling_target uses too)."""

from __future__ import annotations

from datetime import date

import pytest

from fleetcast.config import load_config
from fleetcast.config.memory import GIB
from fleetcast.plan.packing import kv_gib_written, scaling_target
from fleetcast.plan.packing_report import model_rows
from fleetcast.plan.run import PlanOptions, build_packing
from fleetcast.plan.solver import floor_tenth

from .conftest import ROOT, write_plan

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
    write_plan(fleet, result, None, allow_estimated=True)
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
    write_plan(fleet, result, None, allow_estimated=True)
    (pool,) = load_config(fleet).regions[0].pools
    assert [row[column] for row in rows] == [f"{s.kv_cache_gb:.1f}" for s in pool.serves]


@pytest.mark.parametrize("tenth", [2.3, 3.9, 7.3, 14.5])
def test_a_figure_on_the_tenth_grid_a_hair_under_it_stays_there(tenth):
    # 3.9 x (1 / 0.9) / (1 / 0.9) is 3.8999999999999995 in floats: a plain floor to 0.1 gives 3.8.
    assert floor_tenth(tenth - 4e-16) == tenth and floor_tenth(tenth + 0.0999) == tenth
    assert floor_tenth(tenth - 0.0001) == round(tenth - 0.1, 1)


def test_the_written_scaling_target_is_the_plans_on_the_tenth_grid(tmp_path):
    """The config gets the packing's target as planned (solver.scaling_target over its models), rounded down to 0.1
    as the KV budget is (floor_tenth, above)."""
    result = _plan()
    target = scaling_target(result.regions[0].winner)
    assert target == floor_tenth(target) and target >= 1
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLE / "fleet.yaml").read_text())
    write_plan(fleet, result, None, allow_estimated=True)
    (pool,) = load_config(fleet).regions[0].pools
    assert pool.scaling.target == target
