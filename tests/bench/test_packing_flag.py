"""`fleetcast bench run --packing MODEL:COPIES[:KV_GIB],...` (docs/bench.md, 'Several models through one
endpoint'): what a user types by hand is checked before anything runs, each mistake one line naming the flag."""

from __future__ import annotations

import pytest

from fleetcast.bench.mix import parse_packing
from fleetcast.contract.errors import UserError


def test_a_packing_by_hand():
    packing = parse_packing("gpt2-xl:1:20,qwen2.5-1.5b:2", "g6e.xlarge", "L40S")
    assert [(s.model, s.copies, s.kv_cache_gb) for s in packing.serves] == \
        [("gpt2-xl", 1, 20.0), ("qwen2.5-1.5b", 2, None)]
    assert (packing.instance_type, packing.gpu) == ("g6e.xlarge", "L40S")


@pytest.mark.parametrize("kv", ["nan", "inf", "-inf", "0", "-3"])
def test_a_kv_budget_that_is_no_positive_number_is_refused(kv):
    """float() reads 'nan' and 'inf'; nan used to reach the schema (a pydantic traceback) and inf was recorded
    as JSON null, i.e. 'not budgeted', in the results."""
    with pytest.raises(UserError, match=r"^--packing: 'gpt2-xl:1:.*': COPIES must be at least 1 and KV_GIB above 0"):
        parse_packing(f"gpt2-xl:1:{kv},qwen2.5-1.5b:1", None, None)


@pytest.mark.parametrize("model", ["gpt2 xl", "-gpt2", "gpt2//xl"])
def test_a_model_that_is_no_model_id_is_refused(model):
    with pytest.raises(UserError, match=r"^--packing: .* (is not a model id|segment between slashes)"):
        parse_packing(f"{model}:1", None, None)


def test_hub_ids_and_slugged_fine_tune_ids_are_models():
    # fleetcast/contract/model_ids.py: a ':' in an id travels as its slug (!3a), as the bench stack writes it.
    packing = parse_packing("Qwen/Qwen2.5-0.5B-Instruct:2,ft!3agpt-3.5-turbo!3aacme!3a!3a8abc1234:1:4", None, None)
    assert [(s.model, s.copies, s.kv_cache_gb) for s in packing.serves] == [
        ("Qwen/Qwen2.5-0.5B-Instruct", 2, None), ("ft:gpt-3.5-turbo:acme::8abc1234", 1, 4.0)]


def test_the_cli_says_it_in_one_line(capsys, tmp_path):
    from scripts.cli import main

    code = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "2",
                 "--model-mix", "gpt2-xl:0.5,qwen2.5-1.5b:0.5", "--packing", "gpt2-xl:1:nan,qwen2.5-1.5b:1",
                 "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "\n" not in err and "Traceback" not in err and "--packing" in err, err


def test_a_mix_models_tokenizer_that_is_not_there_names_its_flag(tmp_path):
    """Checked when the mix is read, before any load runs, and named as the user gave it (not as --tokenizer)."""
    from fleetcast.bench.mix import mix_models

    with pytest.raises(UserError, match=r"^--model-tokenizer gpt2-xl=.*nowhere: .*nowhere has no tokenizer\.json"):
        mix_models({"gpt2-xl": 0.5, "qwen2.5-1.5b": 0.5}, "16", "4", {}, {}, {"gpt2-xl": str(tmp_path / "nowhere")},
                   None)


def test_a_results_file_with_an_infinite_kv_budget_is_refused_naming_the_field(tmp_path):
    """JSON as Python writes and reads it takes Infinity; a packing's budget that is no finite number is refused
    when the file is read, before the planner sizes memory with it."""
    import json
    from pathlib import Path

    from fleetcast.bench.schema import load_results

    doc = json.loads((Path(__file__).resolve().parents[2] / "bench" / "data" /
                      "h200-colocate-gpt2-xl-together.json").read_text())
    doc["packing"]["serves"][0]["kv_cache_gb"] = float("inf")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"packing\.serves\.0\.kv_cache_gb"):
        load_results(path)
