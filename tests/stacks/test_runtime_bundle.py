"""The runtime bundle ships what an instance runs and nothing else, built once per synthesis inside the
cloud assembly (the old bundle copied all of fleetcast/ and runtime/ into a new temp dir per region)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from stacks.runtime_bundle import BENCH, PROBE, SERVING, _imports, bundle_files, stage_bundle

from .synthesized import default_doc, default_fleet, synthesize

NEVER_ON_A_SERVING_HOST = ("fleetcast/plan/", "fleetcast/bench/", "fleetcast/usage/", "fleetcast/connections/",
                           "fleetcast/deploy.py", "fleetcast/smoke.py", "runtime/devtools/", "runtime/reference/",
                           "runtime/demo.py", "runtime/userdata.py", "scripts/", "stacks/", "tests/")


def test_the_serving_bundle_holds_the_contract_layer_the_config_model_and_the_serving_runtime():
    files = [str(p) for p in bundle_files(SERVING)]
    assert not [f for f in files if f.startswith(NEVER_ON_A_SERVING_HOST)]
    for needed in ("fleetcast/contract/__init__.py", "fleetcast/config/model.py", "runtime/bootstrap.py",
                   "runtime/gateway/server.py", "runtime/trtllm.py", "runtime/systemd/fleetcast-runtime.service",
                   "runtime/host/run-container.sh", "fleetcast/config/data/instances.yaml"):
        assert needed in files
    print("\n".join(files))  # the list, for review: `pytest -s -k serving_bundle_holds`


def test_bench_and_probe_bundles_add_only_the_bench_client():
    serving = set(map(str, bundle_files(SERVING)))
    bench = set(map(str, bundle_files(BENCH)))
    assert bench > serving
    # The bench client and what it imports (its `collect` command's AWS session, the contract's bench
    # defaults and bucket layout), nothing of the planner.
    assert all(f.startswith(("fleetcast/bench/", "fleetcast/aws_session.py", "fleetcast/contract/"))
               for f in bench - serving), sorted(bench - serving)
    probe = set(map(str, bundle_files(PROBE)))
    assert "runtime/probe/fleetcast-probe.service" in probe and "runtime/bootstrap.py" not in probe


def _without_the_checkout(bundle: Path, code: str) -> subprocess.CompletedProcess:
    """Run `code` with only the bundle on the path for project modules (the editable install's finder,
    which maps `fleetcast`/`runtime` to the checkout, is removed), third-party packages as installed."""
    checkout = str(Path(__file__).resolve().parents[2])
    prelude = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()];"
               f"sys.path[:] = [{str(bundle)!r}] + [p for p in sys.path if p not in ('', {checkout!r})];")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=bundle, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_serving_entry_points_import_from_the_bundle_alone(tmp_path):
    bundle = stage_bundle(tmp_path, SERVING)
    done = _without_the_checkout(bundle, "import runtime.bootstrap, runtime.gateway.__main__, runtime;"
                                         "print(runtime.__file__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(bundle))


def test_the_probe_entry_points_import_from_the_probe_bundle_alone(tmp_path):
    bundle = stage_bundle(tmp_path, PROBE)
    done = _without_the_checkout(bundle, "import fleetcast.bench.job, fleetcast.bench.cli")
    assert done.returncode == 0, done.stderr


def test_one_bundle_per_synthesis_inside_the_assembly_and_none_in_the_temp_dir(monkeypatch):
    made = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **kw: made.append(kw.get("prefix")) or real_mkdtemp(*a, **kw))
    fleet = synthesize(default_doc(), "bundle-once")
    assert made == ["fleetcast-bundle-once-"]  # the assembly's own directory, nothing per region
    staged = fleet.outdir / ".fleetcast-bundles" / SERVING.name
    assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()) == \
        [str(p) for p in bundle_files(SERVING)]
    # Two provider regions, one bundle: both stacks' assets come from the same content hash.
    hashes = set()
    for region in fleet.cfg.regions:
        text = (fleet.outdir / f"{fleet.cfg.name}-provider-{region.region}.template.json").read_text()
        hashes |= {part.split(".zip")[0][-64:] for part in text.split("FLEETCAST_RUNTIME_BUNDLE=s3://")[1:]}
    assert len(hashes) == 1


def test_the_default_fleet_ships_the_serving_bundle():
    fleet = default_fleet()
    assert (fleet.outdir / ".fleetcast-bundles" / SERVING.name / "runtime" / "bootstrap.py").is_file()


def test_a_source_file_that_changes_is_read_again(tmp_path):
    """Each synthesis stages its bundles again, and what a file imports is kept between them: kept with the file's
    modification time and size, so an edited file's new imports are seen (a stale closure would ship without them)."""
    source = tmp_path / "entry.py"
    source.write_text("import runtime.serve\n")
    assert _imports(source, "runtime.entry") == {"runtime.serve"}
    source.write_text("import runtime.serve\nfrom fleetcast.contract import names\n")
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1_000_000))
    assert _imports(source, "runtime.entry") == {"runtime.serve", "fleetcast.contract", "fleetcast.contract.names"}
