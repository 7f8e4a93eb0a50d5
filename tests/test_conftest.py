"""How tests/conftest.py groups the suite: a module that builds CDK apps, however it imports the CDK, runs on
the one worker that has aws-cdk-lib loaded; others are free to go anywhere."""

from pathlib import Path

import pytest

from tests.conftest import (
    _PROCESS_MODULES,
    ROOT,
    _area_rank,
    _builds_cdk_apps,
    _has_module_fixture,
    _imports_any,
    _item_builds_cdk_apps,
)


def test_modules_that_build_cdk_apps_are_found_by_their_imports():
    builds = lambda rel: _builds_cdk_apps(str(ROOT / rel))  # noqa: E731
    assert builds("tests/stacks/test_provider_stack.py")  # `from aws_cdk.assertions import ...` at the top
    assert builds("tests/config/test_init.py")  # `from tests.stacks.synthesized import ...` inside a test
    assert builds("tests/stacks/test_slo_scaling.py")  # through another test module's helpers
    assert builds("tests/stacks/test_app.py")  # `from .synthesized import ...`
    assert not builds("tests/plan/test_cli.py")
    assert not builds("tests/stacks/test_plan_drift_handler.py")  # the Lambda's code, no CDK


def test_helpers_that_import_each_other_end_the_search(monkeypatch):
    """Two helpers that import each other (tests/stacks/synthesized.py and tests/bench/conftest.py did): a module
    that imports neither of `modules` is answered, not followed round the cycle until the recursion limit (which
    stopped a run's collection). The cycle is given here, as what the two files import; the walk reads the rest."""
    from tests import conftest

    a, b = "tests/bench/conftest.py", "tests/stacks/synthesized.py"
    cycle = {str(ROOT / a): frozenset({"tests.stacks.synthesized"}),
             str(ROOT / b): frozenset({"tests.bench.conftest", "aws_cdk"})}
    monkeypatch.setattr(conftest, "_module_facts", lambda path: (cycle[path], False, cycle[path]))
    walk = conftest._imports_any.__wrapped__  # past the cache, which holds the real files' answers
    assert not walk(str(ROOT / a), ("no_such_module",))
    assert walk(str(ROOT / a), ("aws_cdk",))


def test_the_bench_helpers_that_client_and_planner_tests_import_do_not_build_cdk_apps():
    """Bench client, report and smoke tests import tests/bench/conftest.py's `free_port`: it imports no CDK, so they
    run on any worker, not one after another on the CDK worker."""
    assert not _builds_cdk_apps(str(ROOT / "tests/bench/conftest.py"))
    for rel in ("tests/bench/test_results_say_what_they_measured.py", "tests/bench/test_model_mix.py",
                "tests/bench/test_accuracy.py", "tests/bench/test_tls.py", "tests/smoke/test_smoke_models.py"):
        assert not _builds_cdk_apps(str(ROOT / rel)), rel
    assert _builds_cdk_apps(str(ROOT / "tests/bench/bench_fleet.py"))


def test_scenario_areas_come_before_unit_tests():
    class Item:
        def __init__(self, rel):
            self.path = ROOT / rel

    ranks = [_area_rank(Item(p)) for p in ("tests/stacks/test_app.py", "tests/runtime/test_bootstrap.py",
                                           "tests/config/test_loader.py", "tests/test_docs.py")]
    assert ranks == sorted(ranks) and ranks[0] < ranks[2] == ranks[3]


def test_modules_with_a_module_scoped_fixture_are_found():
    assert _has_module_fixture(str(ROOT / "tests/runtime/test_bootstrap.py"))
    assert not _has_module_fixture(str(ROOT / "tests/runtime/test_spot.py"))


def test_every_test_that_builds_cdk_apps_is_in_the_cdk_group_alone(request):
    """pytest-xdist joins an item's xdist_group names: a module's own group beside `cdk` made a group of its own
    (test_stack_size's `cdk_stack_size`), on another worker that loaded aws-cdk-lib and synthesized the shared
    fleets (the default, the multi-model and the spill examples) a second time."""
    for item in request.session.items:
        if _item_builds_cdk_apps(item):
            assert [m.args[0] for m in item.iter_markers("xdist_group")] == ["cdk"], item.nodeid


def test_a_module_that_synthesizes_in_one_test_keeps_its_other_tests_off_the_cdk_worker(request):
    """tests/plan/test_packing.py imports the synthesized fleets inside one test: that test goes to the CDK worker,
    the planner tests beside it go anywhere. A module that imports the CDK at its top goes there whole."""
    def collected(module: str) -> list:
        return [item for item in request.session.items if item.nodeid.startswith(module + "::")]

    packing, provider = collected("tests/plan/test_packing.py"), collected("tests/stacks/test_provider_stack.py")
    if not packing or not provider:
        pytest.skip("tests/plan/test_packing.py or tests/stacks/test_provider_stack.py is not collected in this run")
    synthesizes = [item for item in packing if item.get_closest_marker("synth") is not None]
    assert 1 <= len(synthesizes) and len(packing) - len(synthesizes) > 10  # the written packing's synthesis alone
    assert all(item.get_closest_marker("synth") is not None for item in provider)


def test_a_function_that_calls_a_helper_which_synthesizes_builds_cdk_apps(monkeypatch):
    """What a test calls in its module counts, however deep (a class's methods included), and so does a fixture."""
    import ast
    import functools

    from tests import conftest

    module = ROOT / "tests" / "probe_synth_module.py"
    source = (
        "import pytest\n\n"
        "def _fleet():\n    from tests.stacks.synthesized import default_fleet\n    return default_fleet()\n\n"
        "def _outer():\n    return _fleet()\n\n"
        "class Helper:\n    def fleet(self):\n        return _outer()\n\n"
        "@pytest.fixture\ndef fleet():\n    return _outer()\n\n"
        "def test_calls_a_helper():\n    assert _outer()\n\n"
        "def test_uses_a_class():\n    assert Helper().fleet()\n\n"
        "def test_plans():\n    assert 1\n"
    )
    parse = conftest._parse
    monkeypatch.setattr(conftest, "_parse", lambda path: ast.parse(source) if path == str(module) else parse(path))
    for cached in ("_module_facts", "_function_facts", "_imports_any"):  # fresh caches, for the probe's answers
        monkeypatch.setattr(conftest, cached, functools.cache(getattr(conftest, cached).__wrapped__))
    path = str(module)
    assert conftest._function_builds_cdk_apps(path, "test_calls_a_helper")
    assert conftest._function_builds_cdk_apps(path, "test_uses_a_class")
    assert conftest._function_builds_cdk_apps(path, "fleet")  # the fixture
    assert not conftest._function_builds_cdk_apps(path, "test_plans")


def test_a_modules_own_xdist_group_is_kept_whole(request):
    """The multi-model and MPS fault modules name one group, and the in-process engine modules another (PyTorch
    imported once, in one worker): a path group beside it would split each into groups of their own."""
    own = {"tests/runtime/test_multi_model.py": "multi-model", "tests/runtime/test_mps_fault.py": "multi-model",
           "tests/runtime/test_reference_engine.py": "torch-in-process",
           "tests/runtime/test_reference_prefix_cache.py": "torch-in-process",
           "tests/runtime/test_reference_bench_script.py": "torch-in-process"}
    for item in request.session.items:
        rel = Path(item.path).relative_to(ROOT).as_posix()
        if rel in own:
            assert [m.args[0] for m in item.iter_markers("xdist_group")] == [own[rel]], item.nodeid


def test_openmp_threads_of_the_tests_and_their_processes_wait_passively():
    """GCC libgomp manual, OMP_WAIT_POLICY and GOMP_SPINCOUNT: PASSIVE is a spin count of 0 where unset spins
    300,000 times; a process the suite starts inherits it (tests/conftest.py)."""
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "PASSIVE"


def test_the_end_of_run_garbage_collection_runs_twice_not_five_times(pytestconfig):
    from _pytest.unraisableexception import gc_collect_iterations_key

    assert pytestconfig.stash[gc_collect_iterations_key] == 2


def test_the_slow_tiers_are_found_by_what_a_module_imports_and_the_fast_tier_is_what_is_left():
    starts = lambda rel: _imports_any(str(ROOT / rel), _PROCESS_MODULES)  # noqa: E731
    assert starts("tests/contract/test_entry.py")  # runs the CLI as a process
    assert starts("tests/runtime/test_multi_model.py")  # a fleet of real processes
    assert not starts("tests/config/test_patterns.py") and not _builds_cdk_apps(str(ROOT / "tests/config/test_patterns.py"))


def test_every_collected_test_carries_its_tiers(request):
    for item in request.session.items:
        names = {m.name for m in item.iter_markers()}
        assert ("synth" in names) == _item_builds_cdk_apps(item), item.nodeid
        if _imports_any(str(item.path), _PROCESS_MODULES):
            assert "processes" in names, item.nodeid



def test_the_cpu_log_records_each_tests_own_cpu_and_its_processes(tmp_path, monkeypatch):
    """TEST_CPU_LOG=FILE (README, Development): one JSON line per test, the CPU spent in the test's process and in
    the processes it started and reaped. Here the hook wraps a stand-in test that runs a child."""
    import json
    import os
    import subprocess
    import sys
    import time

    from tests import conftest

    log = tmp_path / "cpu.jsonl"
    monkeypatch.setattr(conftest, "_CPU_LOG", str(log))

    class Item:
        nodeid = "tests/probe.py::test_spins_a_child"

    started = time.monotonic()
    steps = conftest.pytest_runtest_protocol(Item(), None)  # pluggy's hookimpl marks the function, not wraps it
    next(steps)
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)  # the test's body
    for _ in steps:
        pass
    [line] = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["test"] == Item.nodeid
    assert line["children_s"] > 0 and line["own_s"] >= 0 and line["wall_s"] > 0
    # and where it ran and when it ended, on the machine's one monotonic clock: each worker's timeline
    assert line["worker"] == os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert started - 0.002 <= line["ended_s"] - line["wall_s"] and line["ended_s"] <= time.monotonic() + 0.001  # ms, rounded


def test_the_cpu_log_counts_a_child_that_is_still_running_when_the_test_ends(tmp_path, monkeypatch):
    """aws-cdk-lib's jsii kernel (Node.js) runs for the whole test process and does most of an in-process synthesis:
    its CPU during a test is the test's, though nothing reaps it. Here a stand-in child spins, then waits for its
    stdin to close, alive when the hook reads the CPU."""
    import json
    import subprocess
    import sys

    from tests import conftest

    log = tmp_path / "cpu.jsonl"
    monkeypatch.setattr(conftest, "_CPU_LOG", str(log))

    class Item:
        nodeid = "tests/probe.py::test_talks_to_a_long_lived_kernel"

    steps = conftest.pytest_runtest_protocol(Item(), None)
    next(steps)
    kernel = subprocess.Popen([sys.executable, "-c", "import sys; sum(range(20_000_000)); print(1, flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert kernel.stdout.readline() == b"1\n"  # it has spun
        for _ in steps:
            pass
    finally:
        kernel.communicate()
    [line] = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["children_s"] >= 0.2, line  # 20 million additions: about half a second of CPU


def test_the_cpu_log_names_each_python_process_a_test_started_and_its_cpu(tmp_path):
    """TEST_CPU_LOG=FILE also writes FILE.processes: one line per Python process at its exit, with its program, the
    test that started it and its own CPU (tests/cpu_by_process/sitecustomize.py, put on PYTHONPATH by conftest)."""
    import json
    import os
    import subprocess
    import sys

    from tests import conftest

    log = tmp_path / "cpu.jsonl.processes"
    env = {**os.environ, "PYTHONPATH": str(conftest._PROCESS_SITE), "TEST_PROCESS_CPU_LOG": str(log),
           "PYTEST_CURRENT_TEST": "tests/probe.py::test_spins_a_child (call)"}
    subprocess.run([sys.executable, "-m", "json.tool", "--help"], env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], env=env, check=True)
    first, second = (json.loads(x) for x in log.read_text().splitlines())
    assert first["program"].endswith(os.path.join("json", "tool.py")) and second["program"] == "-c"
    assert first["test"] == second["test"] == "tests/probe.py::test_spins_a_child"
    assert second["cpu_s"] > 0 and second["torch"] is False
    summary = subprocess.run([sys.executable, "-m", "tests.cpu_by_process", str(log)], cwd=conftest.ROOT,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(summary) == 2 and all("tests/probe.py" in line for line in summary)


def test_a_process_that_ends_with_os_exit_is_in_the_cpu_log_too(tmp_path):
    """runtime/reference/worker.py ends with os._exit (no interpreter shutdown under its engine thread), as do the
    forks of tests/runtime/zygote.py: atexit never runs there, so the line is written by os._exit itself."""
    import json
    import os
    import subprocess
    import sys

    from tests import conftest

    log = tmp_path / "cpu.jsonl.processes"
    env = {**os.environ, "PYTHONPATH": str(conftest._PROCESS_SITE), "TEST_PROCESS_CPU_LOG": str(log),
           "PYTEST_CURRENT_TEST": "tests/probe.py::test_starts_an_engine (call)"}
    done = subprocess.run([sys.executable, "-c", "import os; sum(range(3_000_000)); os._exit(3)"], env=env, check=False)
    assert done.returncode == 3
    [line] = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["program"] == "-c" and line["cpu_s"] > 0 and line["test"] == "tests/probe.py::test_starts_an_engine"
