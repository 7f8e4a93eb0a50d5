"""Results revision 3 say what shared the instance while they were measured: the packing (models,
copies, KV budgets) and, per run, at what load each peer ran. Older files still read; a packed file
holds one of the packing's models; the H200 co-location dataset carries its packing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetcast.bench.report import csv_rows, packing_text, write_report
from fleetcast.bench.schema import SCHEMA_REVISION, load_results
from fleetcast.contract.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data"
GIB = 1 << 30


def _packed(tmp_path: Path, **change) -> Path:
    raw = json.loads((DATA / "h200-colocate-gpt2-xl-together.json").read_text())
    raw.update(change)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    return path


def test_revision_3_adds_packing_and_peers():
    assert SCHEMA_REVISION >= 3


@pytest.mark.parametrize("model", ["gpt2-medium", "gpt2-xl"])
def test_the_h200_dataset_records_its_packing_and_each_runs_peer_load(model):
    # bench/data/h200-colocate.json is what bench/h200_colocate.py started: one process per model with
    # --kv-cache-bytes from its `models` table; the alone files ran with the peer loaded and idle, the
    # together files while the peer ran the same closed-loop level.
    dataset = json.loads((DATA / "h200-colocate.json").read_text())
    budgets = {f"{m}-shape": spec["planned_kv_bytes"] / GIB for m, spec in dataset["models"].items()}
    (peer,) = [m for m in budgets if m != f"{model}-shape"]
    alone = load_results(DATA / f"h200-colocate-{model}-alone.json")
    together = load_results(DATA / f"h200-colocate-{model}-together.json")
    peer_together = {r.load.concurrency: r for r in load_results(DATA / f"h200-colocate-{peer[:-6]}-together.json").runs}
    for res in (alone, together):
        assert res.revision == 7 and res.packing is not None
        # Revision 7: how the two processes shared the GPU; h200_colocate.py starts no MPS daemon.
        assert res.packing.gpu_sharing == "time_slicing" and all(r.repeat is None for r in res.runs)
        assert res.labels.model == f"{model}-shape" and res.labels.model in res.packing.models()
        assert {s.model: (s.copies, s.kv_cache_gb) for s in res.packing.serves} == {m: (1, b) for m, b in budgets.items()}
        assert res.packing.gpu == "H200" and res.packing.instance_type is None  # a lab GPU, not an AWS instance
    assert alone.packing == together.packing
    assert all(r.peers == {peer: 0.0} for r in alone.runs)
    for run in together.runs:
        # The peer's own measured mean concurrency over the run it ran at the same level at the same time.
        assert run.peers == {peer: pytest.approx(peer_together[run.load.concurrency].summary.mean_concurrency, abs=1e-3)}
        assert run.peers[peer] > 0.9 * run.load.concurrency


def test_a_file_without_packing_still_reads_as_unknown(tmp_path):
    raw = json.loads((DATA / "h200-colocate-gpt2-xl-alone.json").read_text())
    raw.pop("packing")
    raw["revision"] = 2
    for run in raw["runs"]:
        run.pop("peers")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    res = load_results(path)
    assert res.packing is None and all(r.peers is None for r in res.runs)
    assert packing_text(res) == "not recorded (file older than revision 3)"


def test_a_packed_file_must_hold_one_of_the_packings_models(tmp_path):
    raw = json.loads(_packed(tmp_path).read_text())
    raw["labels"]["model"] = "qwen2.5-1.5b"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"labels.model 'qwen2.5-1.5b' is not one of packing.serves "
                                        r"\(gpt2-medium-shape, gpt2-xl-shape\)"):
        load_results(path)


def test_peers_must_be_the_packings_other_models(tmp_path):
    raw = json.loads(_packed(tmp_path).read_text())
    raw["runs"][1]["peers"] = {"gpt2-xl-shape": 3.0}  # the file's own model is no peer
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"runs\[1\].peers names gpt2-xl-shape, not a peer in packing.serves "
                                        r"\(peers: gpt2-medium-shape\)"):
        load_results(path)
    raw["packing"] = None
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="peers is set but packing is not"):
        load_results(path)


def test_a_model_named_twice_in_a_packing_is_refused(tmp_path):
    raw = json.loads(_packed(tmp_path).read_text())
    raw["packing"]["serves"].append({"model": "gpt2-xl-shape", "copies": 2})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="packing.serves names gpt2-xl-shape more than once"):
        load_results(path)


def test_report_and_csv_say_what_shared_the_instance(tmp_path):
    res = load_results(DATA / "h200-colocate-gpt2-xl-together.json")
    rows = csv_rows([res])
    assert rows[0]["packing"] == "gpt2-medium-shape x1 (KV 6 GiB each), gpt2-xl-shape x1 (KV 20 GiB each) on H200 (time slicing)"
    assert rows[-1]["peers"].startswith("gpt2-medium-shape at 6") and rows[-1]["peers"].endswith(" in flight")
    page = write_report([res], tmp_path / "rep").read_text()
    assert "sharing the instance (packing): gpt2-medium-shape x1 (KV 6 GiB each)" in page
    assert "peers: gpt2-medium-shape at 1.0 in flight" in page


def test_an_alone_and_a_together_file_of_one_model_read_apart_in_a_report():
    from fleetcast.bench.report import series_names

    files = [load_results(DATA / f"h200-colocate-gpt2-xl-{kind}.json") for kind in ("alone", "together")]
    assert series_names(files) == ["gpt2-xl-shape / H200 / fp16 / reference / peers idle",
                                   "gpt2-xl-shape / H200 / fp16 / reference / peers busy"]
