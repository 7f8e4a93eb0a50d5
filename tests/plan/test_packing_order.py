"""The packing search's enumeration order (docs/plan.md, "Candidates"): fewest processes first, so the
MAX_PACKINGS cap leaves out the largest packings and a wider --max-copies never loses a packing a narrower one
would have found."""

from __future__ import annotations

import itertools
from datetime import date

from fleetcast.contract.serving import MAX_PROCESSES
from fleetcast.plan.packing import packings_by_size
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"


def test_every_packing_comes_once_fewest_processes_first():
    precisions = [["fp16", "int8_wo"], ["bf16"], ["bf16", "fp8"]]
    got = list(packings_by_size(precisions, 3))
    expected = {tuple(zip(p, c)) for p in itertools.product(*precisions)
                for c in itertools.product(range(1, 4), repeat=3)}
    assert len(got) == len(set(got)) and set(got) == expected
    sizes = [sum(c for _, c in combo) for combo in got]
    assert sizes == sorted(sizes) and sizes[0] == 3 and sizes[-1] == 9


def test_no_packing_passes_the_process_limit():
    assert max(sum(c for _, c in combo) for combo in packings_by_size([["fp16"], ["fp16"]], 40)) == MAX_PROCESSES


def _winner(max_copies: int):
    opts = PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(EXAMPLE / "traffic.yaml"),
                       config=str(EXAMPLE / "fleet.yaml"), today=date(2026, 2, 1))
    result = build_packing(opts, max_copies=max_copies)[0]
    return result.regions[0]


def test_a_wider_copy_limit_never_picks_a_dearer_packing():
    """examples/plan/multi-model with --max-copies 100: the search stops at MAX_PACKINGS on both types, and
    (in the product's order, which ran a model's first precision through all 100 copies first) used to pick
    gpt2-xl fp16 x1 + qwen2.5-0.5b bf16 x6 + qwen2.5-3b fp8 x1 at $4.25/h over the $3.01/h packing that
    --max-copies 2 finds."""
    narrow, wide = _winner(2).winner, _winner(100)
    assert any("stopped after" in n and "fewest processes first" in n for n in wide.notes)
    assert wide.winner.cost_per_hour <= narrow.cost_per_hour + 1e-9
    assert wide.winner.label == narrow.label


def test_a_model_without_curves_points_at_the_notes():
    """Without any curve of qwen2.5-3b no packing is evaluated, so nothing is 'ruled out': the notes say why."""
    from fleetcast.plan.packing_report import recommendation

    results = [str(p) for p in sorted((EXAMPLE / "results").glob("*.json")) if "qwen2.5-3b" not in p.name]
    opts = PlanOptions(results=results, traffic=str(EXAMPLE / "traffic.yaml"), config=str(EXAMPLE / "fleet.yaml"),
                       today=date(2026, 2, 1))
    (region,) = build_packing(opts)[0].regions
    assert region.winner is None and not region.evaluations
    assert recommendation(region).endswith("no packing serves every model within its SLO (see notes)")
    assert any("no curve (at a precision its GPU runs) for qwen2.5-3b" in n for n in region.notes)


def test_the_help_says_the_default_copy_limit_the_search_uses():
    """The parser does not import the planner (a lighter CLI start), so its help states the default in words:
    held to packing.DEFAULT_MAX_COPIES here."""
    from fleetcast.plan.packing import DEFAULT_MAX_COPIES
    from scripts.cli import build_parser

    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    (action,) = [a for a in plan._actions if "--max-copies" in a.option_strings]
    assert f"(default {DEFAULT_MAX_COPIES})" in action.help
