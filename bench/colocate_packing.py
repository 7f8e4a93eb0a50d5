"""Record in the H200 co-location dataset what shared the GPU and how (bench results revisions 3 and 7).

    python bench/colocate_packing.py   # rewrites bench/data/h200-colocate-<model>-<alone|together>.json

The runs were measured before revision 3 (bench/h200_colocate.py, one `fleetcast bench run` per model
and level), so the packing is read back from the dataset itself: each model's planned KV budget in
h200-colocate.json (`models`, what --kv-cache-bytes was), one copy each, GPU H200, no AWS instance type.
Each run's `peers` is the other model's mean concurrency over the run it ran at the same time (the
together file of the same level), or 0 in an alone file (the other model loaded and idle). The two
processes time-sliced the GPU (bench/h200_colocate.py starts no MPS daemon): `packing.gpu_sharing` says so
(revision 7; each level ran once, so no run carries `repeat`). Idempotent.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
GIB = 1 << 30
MODELS = ("gpt2-medium", "gpt2-xl")
LABEL = "{}-shape"  # the files' labels.model (the reference backend serves these shapes)


def packing(dataset: dict) -> dict:
    return {"instance_type": None, "gpu": "H200", "gpu_sharing": "time_slicing",
            "serves": [{"model": LABEL.format(m), "copies": 1,
                        "kv_cache_gb": dataset["models"][m]["planned_kv_bytes"] / GIB} for m in MODELS]}


def level(run: dict) -> int:
    return run["load"]["concurrency"]


def main() -> int:
    dataset = json.loads((DATA / "h200-colocate.json").read_text())
    pack = packing(dataset)
    files = {(m, kind): DATA / f"h200-colocate-{m}-{kind}.json" for m in MODELS for kind in ("alone", "together")}
    raw = {key: json.loads(path.read_text()) for key, path in files.items()}
    for (model, kind), data in raw.items():
        (peer,) = [m for m in MODELS if m != model]
        peer_runs = {level(r): r for r in raw[(peer, "together")]["runs"]}
        for run in data["runs"]:
            busy = kind == "together"
            run["peers"] = {LABEL.format(peer): round(peer_runs[level(run)]["summary"]["mean_concurrency"], 3)
                            if busy else 0.0}
        data["packing"] = pack
        data["revision"] = 7
        files[(model, kind)].write_text(json.dumps(data, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
