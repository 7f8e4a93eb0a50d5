"""Fixtures shared by every test area: one loopback moto server for the session (a real AWS API for
S3, Secrets Manager, CloudWatch and Auto Scaling; never AWS) and the dummy-credential environment that
points boto3 at it. Tests that share the server keep apart by their own names (unique buckets, secrets)
or by resetting it (tests/usage).

And how the suite runs on few cores (`make test`): the modules that build CDK apps share one xdist worker, so
do the tests of a module with a module-scoped fixture, the areas with end-to-end scenarios are handed out
first, and the collected suite is kept out of the GC."""

import ast
import functools
import gc
import json
import os
import resource
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _pytest.unraisableexception import gc_collect_iterations_key  # pytest 8.4's own setting, kept in the stash

ROOT = Path(__file__).resolve().parents[1]

# PyTorch's CPU wheel runs its intra-op threads on GNU OpenMP (torch/lib/libgomp.so.1), whose idle threads spin
# 300,000 times after each parallel region before they sleep when OMP_WAIT_POLICY is unset, and not at all when it
# is PASSIVE (GCC libgomp manual, "GOMP_SPINCOUNT" and "OMP_WAIT_POLICY"). On a machine the suite's workers and
# their engine processes share, that spinning is CPU taken from the others: the in-process engine tests took 18 s
# of CPU with it and 13 s without, on 2 loaded cores. Set here, so the test processes and every process they start
# (reference engines, bootstraps) wait passively; what a test measures is unchanged, only the idle waiting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Node.js runs V8's background jobs (concurrent compilation and tier-up, GC tasks) on a pool of 4 threads by default
# (Node.js doc/api/cli.md, `--v8-pool-size=num`: "Set V8's thread pool size which will be used to allocate
# background jobs"; src/node_options.h, v8_thread_pool_size = 4; allowed in NODE_OPTIONS). aws-cdk-lib's built-in
# CloudFormation validation compiles an 8.9 MB WebAssembly engine in each jsii kernel, and the pool's speculative
# compiling of it cost more CPU than the work: its start and one validation took 6.6 s of CPU on 4 threads and 3.4 s
# on one. With one thread, in-process syntheses of the default and variant fleets (one validated) took 20.5 s of CPU
# instead of 27. The CDK CLI, the apps it runs and their kernels inherit it. What JavaScript computes is unchanged;
# only where V8 compiles.
os.environ["NODE_OPTIONS"] = " ".join(o for o in (os.environ.get("NODE_OPTIONS"), "--v8-pool-size=1") if o)


@pytest.fixture
def unrasterized(monkeypatch):
    """For a test that reads a report's pages (a plan's, a bench run's), not its pictures: each figure is still
    built (a plot that fails still fails the test), but saving it writes a placeholder file instead of rasterizing
    it, the report's most expensive step. Never for a test that reads a picture's pixels or its file."""
    from matplotlib.figure import Figure

    def placeholder(fig, path, *a, **k):
        Path(path).write_bytes(b"")

    monkeypatch.setattr(Figure, "savefig", placeholder)


@pytest.fixture(scope="session")
def moto_endpoint():
    # Imported here, not at collection: moto is heavy and most test runs (`-k`, one file) never need it.
    from runtime.devtools.harness import moto_server

    # moto's EC2 loads its 1,366 built-in images into every region's backend it makes, and again at every reset
    # (reset_moto re-creates each backend made so far; Auto Scaling's makes EC2's): 0.5 s of CPU per reset once a
    # test has called EC2 or Auto Scaling, two resets per `fresh_aws` test. No test launches from them; those that
    # launch register their own image (tests/gateway/test_discovery.py). moto/settings.py: ec2_load_default_amis.
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    # The tests that call it run commands in this process, each with a botocore session of its own: one loader for
    # them all parses each service model once a run, not once per command (tests/runtime/zygote.py).
    from tests.runtime.zygote import share_aws_loader

    share_aws_loader()
    server = moto_server()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def reset_moto(moto_endpoint: str) -> None:
    """Empty the shared server (moto's own reset API); nothing kept there outlives the test that made it."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()


@pytest.fixture
def aws_env(monkeypatch, moto_endpoint):
    """Dummy credentials and AWS_ENDPOINT_URL=moto for this test; no profile or instance role is consulted."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


@pytest.fixture
def fresh_aws(aws_env):
    """aws_env on an emptied moto, emptied again afterwards: what the test creates no other test sees."""
    reset_moto(aws_env)
    yield aws_env
    reset_moto(aws_env)


# Tests that build CDK apps in this process: those of a module that imports the CDK, the app builder or the shared
# synthesized fleets when it is imported, directly or through another test module, and those whose own function
# (or a function of its module that it calls, or a fixture it uses) imports them. Under pytest-xdist (`make test`
# runs `--dist loadgroup`) they all go to one worker, so the jsii kernel, aws-cdk-lib and each shared fleet
# (tests/stacks/synthesized.py) are loaded and synthesized once per run, not per worker.
_CDK_MODULES = ("aws_cdk", "cdk_nag", "stacks.app_builder", "tests.stacks.synthesized")


def _statements(body: list[ast.stmt]):
    """Every statement, nested ones included (function, class, if, try, with and loop bodies), each with whether it
    is inside a function; expressions are not entered: an import or a decorator is a statement's, and skipping the
    expressions is most of a walk's cost."""
    stack = [(node, False) for node in body]
    while stack:
        node, in_function = stack.pop()
        yield node, in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend((child, inner) for child in getattr(node, field, ()))


def _imported(node: ast.stmt, package: str) -> list[str]:
    """The absolute module names an import statement names (relative ones resolved against `package`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: `from .synthesized import ...`
            base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base]).strip(".")
        return [base]
    return []


def _parse(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(), path)


def _package(path: str) -> str:
    return ".".join(Path(path).relative_to(ROOT).parent.parts)


@functools.cache
def _module_facts(path: str) -> tuple[frozenset[str], bool, frozenset[str]]:
    """What a test module imports (absolute names, relative imports resolved; at the top or inside a test), whether
    it defines a module-scoped fixture, and what it imports outside its functions (what importing it runs): one
    parse per file per run, however many items and questions ask (each collecting worker asks for every item;
    walking each file's whole tree per question cost seconds a worker)."""
    package = _package(path)
    names: set[str] = set()
    top: set[str] = set()
    module_fixture = False
    for node, in_function in _statements(_parse(path).body):
        imported = _imported(node, package)
        names.update(imported)
        if not in_function:
            top.update(imported)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module_fixture = module_fixture or any(
                isinstance(decorator, ast.Call) and any(
                    kw.arg == "scope" and isinstance(kw.value, ast.Constant) and kw.value.value == "module"
                    for kw in decorator.keywords)
                for decorator in node.decorator_list)
    return frozenset(names), module_fixture, frozenset(top)


@functools.cache
def _function_facts(path: str) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Per function of a module (at its top or a class's, by qualified name): what its body imports and the names
    it refers to. Read only for the few modules that reach the CDK inside some of their functions alone."""
    package = _package(path)
    facts: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                imports: set[str] = set()
                refs: set[str] = set()
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Name):
                        refs.add(inner.id)
                    elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                        imports.update(_imported(inner, package))
                facts[prefix + node.name] = frozenset(imports), frozenset(refs)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(_parse(path).body, "")
    return facts


def _helper(name: str) -> str | None:
    """The file of another test module whose helpers `name` imports, if it is one."""
    helper = ROOT.joinpath(*name.split(".")).with_suffix(".py")
    return str(helper) if name.startswith("tests.") and helper.is_file() else None


def _names_reach(names: frozenset[str], modules: tuple[str, ...]) -> bool:
    """One of `names` is one of `modules` (or a submodule), or a test module that imports one anywhere."""
    for name in names:
        if any(name == m or name.startswith(m + ".") for m in modules):
            return True
        helper = _helper(name)
        if helper is not None and _imports_any(helper, modules):
            return True
    return False


@functools.cache
def _imports_any(path: str, modules: tuple[str, ...]) -> bool:
    """The module, or another test module whose helpers it imports, imports one of `modules` (or a submodule)."""
    seen, todo = {path}, [path]  # helpers may import each other: each file is read once, cycles end
    while todo:
        for name in _module_facts(todo.pop())[0]:
            if any(name == m or name.startswith(m + ".") for m in modules):
                return True
            helper = _helper(name)
            if helper is not None and helper not in seen:
                seen.add(helper)
                todo.append(helper)
    return False


def _builds_cdk_apps(path: str) -> bool:
    return _imports_any(path, _CDK_MODULES)


def _function_builds_cdk_apps(path: str, qualname: str, seen: set[str] | None = None) -> bool:
    """The function's body imports the CDK (or a helper that does), or calls a function of its module that does."""
    if not path.startswith(str(ROOT / "tests")) or not _builds_cdk_apps(path):
        return False
    if _names_reach(_module_facts(path)[2], _CDK_MODULES):
        return True  # importing the module loads the CDK: every function of it runs there
    facts = _function_facts(path)
    seen = set() if seen is None else seen
    seen.add(qualname)
    imports, refs = facts.get(qualname, (frozenset(), frozenset()))
    called = {name for name in facts for ref in refs if name == ref or name.startswith(ref + ".")}  # a class: its methods
    return _names_reach(imports, _CDK_MODULES) or any(
        _function_builds_cdk_apps(path, name, seen) for name in called if name not in seen)


def _item_builds_cdk_apps(item) -> bool:
    """The test builds CDK apps: its module does on import, or its own function, a function of its module that it
    calls, or a fixture it uses (from any test module or conftest) imports the CDK. tests/plan/test_packing.py's
    one synthesis among thirty planner tests put the thirty, 28 s of CPU, on the one worker that synthesizes."""
    path = str(item.path)
    if not _builds_cdk_apps(path):
        return False
    function = getattr(item, "function", None)
    if function is None:
        return True  # not a Python function (a doctest): the module's answer
    if _function_builds_cdk_apps(path, function.__qualname__):
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    for defs in (fixtures.name2fixturedefs.values() if fixtures else ()):
        for fixturedef in defs:
            code = getattr(fixturedef.func, "__code__", None)
            if code is not None and _function_builds_cdk_apps(code.co_filename, fixturedef.func.__qualname__):
                return True
    return False


# What starts operating-system processes: a test (or a fixture it uses) that imports one of these runs servers,
# CLIs or fleets as real processes, seconds each on 2 cores.
_PROCESS_MODULES = ("subprocess", "multiprocessing", "concurrent.futures.process", "runtime.devtools.harness")


@functools.cache
def _test_module_starts_processes(module: str) -> bool:
    source = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    return module.startswith("tests") and source.is_file() and _imports_any(str(source), _PROCESS_MODULES)


def _starts_processes(item) -> bool:
    if _imports_any(str(item.path), _PROCESS_MODULES):
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    for defs in (fixtures.name2fixturedefs.values() if fixtures else ()):
        for fixturedef in defs:
            if _test_module_starts_processes(getattr(fixturedef.func, "__module__", "") or ""):
                return True
    return False


# The two slow tiers, by marker: `pytest -m "not synth and not processes"` (`make test-fast`) runs the rest.
TIERS = {
    "synth": "builds CDK apps in this process (aws-cdk-lib through jsii): seconds each, the first in a process 10-20 s",
    "processes": "starts real processes (servers, CLIs, fleets on loopback), or uses a fixture that does",
}


# The areas whose tests run fleets of real processes, or synthesize, go first: xdist hands out tests in
# collection order, so a run that ends on quick unit tests ends with every worker busy, instead of one
# worker finishing a ten-second scenario alone.
_HEAVY_FIRST = ("stacks", "runtime", "traffic", "plan", "bench", "staging", "gateway", "smoke", "usage")


def _area_rank(item) -> int:
    parts = Path(item.path).relative_to(ROOT / "tests").parts
    return _HEAVY_FIRST.index(parts[0]) if len(parts) > 1 and parts[0] in _HEAVY_FIRST else len(_HEAVY_FIRST)


def _has_module_fixture(path: str) -> bool:
    """A `@pytest.fixture(scope="module")` in the module: set up once in every worker that runs one of its tests
    (tests/runtime/test_bootstrap.py's loopback region and its engine cache, a started reference server)."""
    return _module_facts(path)[1]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the markers into groups
def pytest_collection_modifyitems(config, items):
    cdk = pytest.mark.xdist_group("cdk")
    for item in items:
        if _starts_processes(item):
            item.add_marker(pytest.mark.processes)
        if _item_builds_cdk_apps(item):
            item.add_marker(pytest.mark.synth)
            item.add_marker(cdk)
        elif item.get_closest_marker("xdist_group") is not None:
            continue  # the module's own group (pytest-xdist joins several names into a group of their own)
        elif _has_module_fixture(str(item.path)):  # its module's tests share one worker, and the fixture
            item.add_marker(pytest.mark.xdist_group(Path(item.path).relative_to(ROOT).as_posix()))
    items.sort(key=_area_rank)  # stable: within an area, collection order


# Where the suite's time goes, in CPU rather than wall seconds (wall time on 2 shared cores says more about the
# neighbours than about a test): TEST_CPU_LOG=FILE appends one JSON line per test, its setup, call and
# teardown's CPU in this process and in the processes it started and reaped (getrusage(RUSAGE_CHILDREN)).
_CPU_LOG = os.environ.get("TEST_CPU_LOG")
# And which processes that CPU went to: every Python process a test starts (and those start) appends its program
# and own CPU to FILE.processes at exit (tests/cpu_by_process/sitecustomize.py, on the inherited PYTHONPATH);
# `python -m tests.cpu_by_process FILE.processes` sums them per module and program.
_PROCESS_SITE = ROOT / "tests" / "cpu_by_process"
if _CPU_LOG:
    os.environ.setdefault("TEST_PROCESS_CPU_LOG", _CPU_LOG + ".processes")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROCESS_SITE), os.environ.get("PYTHONPATH")) if p)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _live_children_cpu(exclude: frozenset[int]) -> float:
    """CPU of this process's children that are still running, and of their descendants (live or reaped by them):
    the jsii kernel, a Node.js process that aws-cdk-lib starts once per test process and that does most of each
    in-process synthesis, is reaped only at exit, so getrusage(RUSAGE_CHILDREN) never saw it. Once a child is
    reaped, its CPU moves into RUSAGE_CHILDREN, so the sum of the two counts it once. Linux /proc (proc(5): the
    tasks' `children` lists; stat fields 14-17, utime stime cutime cstime, in clock ticks); 0 elsewhere."""
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid in exclude:
                    continue
                try:
                    with open(f"/proc/{kid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()  # after the command, which may hold spaces
                except OSError:
                    continue
                total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime (fields 14-17)
                todo.append(kid)
    return total / _CLOCK_TICKS


def _cpu_now() -> tuple[float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The reference servers forked by this worker's fork server are reaped there, not here (tests/runtime/zygote.py)
    zygote = sys.modules.get("tests.runtime.zygote")
    forked = zygote.cpu_s() if zygote is not None else 0.0
    exclude = frozenset(z.proc.pid for z in zygote.servers()) if zygote is not None else frozenset()  # in `forked`
    return time.process_time(), children.ru_utime + children.ru_stime + forked + _live_children_cpu(exclude)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_LOG:
        yield
        return
    own, children = _cpu_now()
    wall = time.monotonic()
    had_cdk = "aws_cdk" in sys.modules
    yield
    own_after, children_after = _cpu_now()
    ended = time.monotonic()
    # The worker and the end on CLOCK_MONOTONIC (one clock for every process of the machine): each worker's
    # timeline, so a run's tail (one worker still busy while the others are done) shows which tests made it.
    record = {"test": item.nodeid, "own_s": round(own_after - own, 3), "children_s": round(children_after - children, 3),
              "wall_s": round(ended - wall, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
              "ended_s": round(ended, 3)}
    if not had_cdk and "aws_cdk" in sys.modules and item.get_closest_marker("synth") is None:
        record["loaded_cdk"] = True  # a test the imports did not mark loaded aws-cdk-lib on a worker of its own
    line = json.dumps(record)
    with open(_CPU_LOG, "a") as log:  # one short line per append: workers' lines do not interleave
        log.write(line + "\n")


def pytest_configure(config):
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    # When a run ends, pytest collects garbage five times (a constant from the Trio project) so that exceptions
    # raised in finalizers are reported. Over a worker's heap here each full collection costs 0.25 s of CPU, at
    # the very end of the run; measured, the second collection found 0-37 objects and the third to fifth none.
    # Two keep the finalizer check and save three quarters of a second per worker.
    config.stash[gc_collect_iterations_key] = 2


def pytest_collection_finish(session):
    # What collection built (modules, items, fixture definitions) lives for the whole run: frozen, the cyclic
    # collector stops re-scanning it on every full collection; and a higher first threshold lets the planner's,
    # the simulator's and the CDK bindings' short-lived objects go by without a collection every 700 allocations.
    # On tests/plan, tests/traffic and two stack modules in one process: 63 s of CPU -> 50 s. Test processes
    # only; what the tests start runs with Python's defaults.
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


@pytest.fixture(scope="module")
def forked_gateways():
    """The gateways and fake engines that the module's tests start with asyncio (`python -m runtime.gateway`, `-m
    tests.gateway.engine_process`, the bench scripts' `-m scripts.bench_balance _engine`) are forks of this worker's
    fork server for them, which has those modules imported (tests/runtime/zygote.py, gateway_processes): the process
    the test holds is the fork's launcher, which passes on the test's signals and exits as the fork did. For tests
    that do not look at the process's own pid. TEST_NO_ZYGOTE=1 starts them as interpreters of their own."""
    import asyncio

    from tests.runtime.zygote import gateway_processes, launched

    fork_server = gateway_processes()
    if fork_server is None:
        yield
        return
    start = asyncio.create_subprocess_exec

    async def create_subprocess_exec(program, *args, **kwargs):
        return await start(*launched((program, *args), fork_server), **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(asyncio, "create_subprocess_exec", create_subprocess_exec)
        yield


@pytest.fixture(scope="module")
def forked_engines():
    """The reference servers, gateways and reference builds that the product starts during the module's tests (from
    runtime.serve.Serving in this process, or from the processes the tests start with this environment: `python -m
    runtime.bootstrap`, bench/h200_sharing.py) are forks of this worker's fork server, which has PyTorch imported,
    standing where the started process would be: its pid, session, /proc cmdline and environ, captured output and
    exit status (tests/runtime/zygote.py, forking_popen); a server's engine process is a fork of that server, its
    child in its session and group (zygote._local_child). TEST_NO_ZYGOTE=1 starts them as the product does."""
    import subprocess

    from tests.runtime.zygote import ENGINE_SOCKET_VAR, SITE_DIR, forking_popen, reference_servers

    fork_server = reference_servers()
    if fork_server is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENGINE_SOCKET_VAR, fork_server.socket)
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SITE_DIR, os.environ.get("PYTHONPATH")) if p))
        patch.setattr(subprocess, "Popen", forking_popen(fork_server.socket))
        yield
