"""The layers, checked on the source: the contract at the bottom, then the config schema; stacks and the
instance runtime on top of those two only; the CLIs' tool modules beside them, never underneath.

- `fleetcast/contract/` imports the standard library and itself only, so the GPU instance ships it and every
  layer above may import it.
- `stacks/` and `runtime/` import from `fleetcast` only `fleetcast.contract` and `fleetcast.config`.
- nothing under `fleetcast/` imports `stacks`, and no two project modules import each other.
- a `FLEETCAST_*` variable is spelt in the contract's table only (`Var`); elsewhere code names `Var.X`.
- the instance bundles carry no staging (tool) module.

Imports are read with `ast`, lazy ones inside functions included: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetcast.contract.instance_env import KNOWN, PREFIX, Var
from stacks.runtime_bundle import BENCH, PROBE, SERVING, _imports, bundle_files, module_closure

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "fleetcast" / "contract"
ALLOWED_FROM_FLEETCAST = ("fleetcast.contract", "fleetcast.config")

# Named exceptions to "stacks and runtime import only the contract and the config", each with its reason.
EXCEPTIONS = {
    # The scheduled drift check is a Lambda that runs the planner's own drift comparison (its bundle is
    # fleetcast.plan.drift's import closure, stacks/plan_drift.py): the code itself ships, not a fact of it.
    "stacks/lambdas/plan_drift/handler.py": {"fleetcast.plan", "fleetcast.plan.drift"},
}
# Python files that may spell a FLEETCAST_ name, each with its reason.
LITERAL_EXCEPTIONS = {
    # Copied alone into the image build (docker/Dockerfile `COPY runtime/vendor.py`) and run there before
    # any fleetcast module exists; test_the_image_build_names_the_contract_variable checks its one name.
    "runtime/vendor.py",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _python_files(*tops: str) -> Iterator[Path]:
    for top in tops:
        yield from sorted((ROOT / top).rglob("*.py"))


def _imports_of(path: Path) -> set[str]:
    return _imports(path, _module(path))


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_contract_imports_only_the_standard_library_and_itself():
    for path in CONTRACT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and (node.module is None or (CONTRACT / f"{node.module}.py").is_file()), \
                    f"{path.name}: from {'.' * node.level}{node.module}"
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names | {"__future__"}, f"{path.name} imports {name}"


@pytest.mark.parametrize("top", ["stacks", "runtime"])
def test_stacks_and_runtime_import_only_the_contract_and_the_config(top):
    offenders = []
    for path in _python_files(top):
        rel = path.relative_to(ROOT).as_posix()
        allowed = EXCEPTIONS.get(rel, set())
        for module in sorted(_imports_of(path)):
            if _is_under(module, "fleetcast") and module != "fleetcast" and module not in allowed \
                    and not any(_is_under(module, a) for a in ALLOWED_FROM_FLEETCAST):
                offenders.append(f"{rel} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_no_module_under_fleetcast_imports_the_stacks():
    offenders = [f"{p.relative_to(ROOT)} imports {m}" for p in _python_files("fleetcast")
                 for m in sorted(_imports_of(p)) if _is_under(m, "stacks")]
    assert not offenders, "\n".join(offenders)


def test_no_two_project_modules_import_each_other():
    """No import cycle (deploy.py and first_deploy.py used to import each other). Importing a package's own
    parent is not counted: `from . import sibling` names the parent, which Python has already imported."""
    modules = {_module(p): p for p in _python_files("fleetcast", "runtime", "stacks", "scripts")}
    graph = {m: {i for i in _imports(p, m) if i in modules and i != m and not _is_under(m, i)}
             for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, cycles


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


# A shell script embedded in Python (user data) reads the env file: `$FLEETCAST_X` / `${FLEETCAST_X...}`.
_SHELL_READ = re.compile(r"\$\{?(" + PREFIX + r"[A-Z0-9_]+)")


def test_no_fleetcast_variable_is_spelt_outside_the_contract():
    """Code names `Var.X`; a bare string would bypass the table (and check_names). Docstrings may mention a
    variable; embedded shell may read one from the env file, if the table defines it."""
    offenders = []
    for path in [*_python_files("fleetcast", "runtime", "stacks", "scripts"), ROOT / "app.py"]:
        rel = path.relative_to(ROOT).as_posix()
        if path.is_relative_to(CONTRACT) or rel in LITERAL_EXCEPTIONS:
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
                continue
            text = node.value
            unknown = sorted(set(_SHELL_READ.findall(text)) - KNOWN)
            if unknown:
                offenders.append(f"{rel}:{node.lineno}: shell reads {', '.join(unknown)}, which Var does not define")
            if PREFIX in _SHELL_READ.sub("", text):
                offenders.append(f"{rel}:{node.lineno}: {text[:60]!r}")
    assert not offenders, "\n".join(offenders)




def test_the_image_build_names_the_contract_variable():
    from runtime import vendor

    assert vendor.VENDOR_DIR_ENV == Var.DEPS.value
    assert f"ENV {Var.DEPS.value}={vendor.VENDOR_DIR}" in (ROOT / "docker" / "Dockerfile").read_text()


@pytest.mark.parametrize("spec", [SERVING, BENCH, PROBE], ids=lambda s: s.name)
def test_the_instance_bundles_carry_no_staging_module(spec):
    assert [f for f in bundle_files(spec) if f.as_posix().startswith("fleetcast/staging/")] == []


def test_the_serving_bundle_takes_from_fleetcast_only_the_contract_and_the_config():
    stray = sorted(m for m in module_closure(SERVING.entry_points)
                   if _is_under(m, "fleetcast") and m != "fleetcast"
                   and not any(_is_under(m, a) for a in ALLOWED_FROM_FLEETCAST))
    assert stray == []
