"""The packed plan baseline lists each model's adapters (docs/plan.md, "`plan --check` and the drift Lambda"):
the gateway meters a request by the id it named, an adapter's requests load its base model's processes, and the
drift Lambda sums them into the base model's arrivals (tests/stacks/test_plan_drift_handler.py)."""

from __future__ import annotations

import json

from ruamel.yaml import YAML

from scripts.cli import main

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"


def test_the_baseline_names_each_models_adapters(tmp_path, capsys):
    yaml = YAML()
    doc = yaml.load((EXAMPLE / "fleet.yaml").read_text())
    doc["models"][2]["adapters"] = [{"id": "qwen-sql", "source": "org/qwen-sql-lora", "revision": "v1"}]
    fleet = tmp_path / "fleet.yaml"
    with fleet.open("w") as f:
        yaml.dump(doc, f)
    code = main(["plan", "--results", str(EXAMPLE / "results"), "--traffic", str(EXAMPLE / "traffic.yaml"),
                 "--config", str(fleet), "--write-config", str(fleet), "--allow-estimated"])
    assert code == 0, capsys.readouterr().err
    baseline = json.loads((tmp_path / "fleet.plan-baseline.json").read_text())
    (pool,) = baseline["pools"]
    assert {m["model"]: m["adapters"] for m in pool["models"]} == \
        {"gpt2-xl": [], "qwen2.5-0.5b": [], "qwen2.5-3b": ["qwen-sql"]}
    # One format whatever the number of models (fleetcast.plan.check.baseline_document): a packing's pool records
    # the target it scales on and its planned in-flight mix at arrival (every process's requests summed), which
    # the mix check reads; before, a packed pool had neither and skipped that check.
    from fleetcast.config import load_config

    written = load_config(fleet)
    assert pool["target"] == written.regions[0].pools[0].scaling.target
    assert 0 < pool["share_above_target"] < 1
