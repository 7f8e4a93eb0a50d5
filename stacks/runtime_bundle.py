"""What an instance receives: the modules its entry points can import, and nothing else.

The bundle is the import closure of the instance's entry points over the project's own packages
(every `import`/`from` in those modules, lazy ones included), less what only development uses, plus the
data files the runtime reads (systemd units, host scripts, the config's data tables). A CLI, planner or
test change therefore neither ships to a GPU host nor changes the bundle's hash (which rolls the fleet).
Each bundle is built once per synthesis into the cloud assembly's own directory, which `cdk synth`
replaces as a whole, so nothing accumulates in the system's temp directory.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

from fleetcast.contract.packaging import installed_path

# The repository, or the site-packages directory of an installed wheel.
REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("fleetcast", "runtime")


def source_dir(top: str) -> Path:
    """Where the files of the repository's directory `top` lie: in an installed wheel, under the package
    that carries them (fleetcast/contract/packaging.py: `runtime` is `fleetcast_runtime` there); in the
    repository, the directory itself. Bundles keep the repository's names (`python -m runtime.bootstrap`)."""
    return installed_path(REPO_ROOT, top)


def source_of(rel: Path) -> Path:
    """The file behind `rel`, a path as the repository names it (`runtime/bootstrap.py`)."""
    return installed_path(REPO_ROOT, rel)



@dataclass(frozen=True)
class BundleSpec:
    """One kind of instance's bundle: the modules it starts (`python -m`) and the data files it reads."""

    name: str
    entry_points: tuple[str, ...]
    data: tuple[str, ...]  # globs relative to the repository root


# The serving container runs the bootstrap, which starts the model server and the gateway.
SERVING = BundleSpec("runtime", ("runtime.bootstrap", "runtime.gateway.__main__"),
                     ("runtime/systemd/*.service", "runtime/host/*.sh", "fleetcast/config/data/*.yaml"))
# Bench instances (`cdk synth -c bench=true`) serve and also run the bench job.
BENCH = BundleSpec("runtime-bench", SERVING.entry_points + ("fleetcast.bench.job", "fleetcast.bench.cli"), SERVING.data)
# The consumer-side probe runs only the bench job (its wheels are added by stacks/consumer_probe.py).
PROBE = BundleSpec("probe", ("fleetcast.bench.job", "fleetcast.bench.cli"),
                   ("runtime/probe/*.service", "fleetcast/config/data/*.yaml"))

# Reached only under development settings (the PyTorch reference backend, loopback fakes, the demo):
# the instance never imports them, so they are not shipped even though code names them.
DEV_ONLY = ("runtime.devtools", "runtime.reference", "runtime.demo")

_built: dict[tuple[str, BundleSpec], Path] = {}


def _path_of(module: str) -> Path | None:
    top, *rest = module.split(".")
    base = source_dir(top).joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_dev_only(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in DEV_ONLY)


# What each source file imports, by (path, module), kept with the file's (mtime, size): every synthesis stages its
# bundles again (a new assembly directory), and parsing the closure's ~100 files took 0.4-0.8 s of CPU per bundle
# and synthesis; a file that changes is parsed again.
_parsed: dict[tuple[Path, str], tuple[tuple[int, int], frozenset[str]]] = {}


def _imports(path: Path, module: str) -> set[str]:
    stat = path.stat()
    version = (stat.st_mtime_ns, stat.st_size)
    known = _parsed.get((path, module))
    if known is None or known[0] != version:
        known = version, frozenset(_parse_imports(path, module))
        _parsed[(path, module)] = known
    return set(known[1])


def _parse_imports(path: Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from pkg import name` may name a submodule.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PROJECT_PACKAGES}


def module_closure(entry_points: tuple[str, ...]) -> set[str]:
    """Every project module the entry points can import (parent packages included), less DEV_ONLY."""
    seen: set[str] = set()
    todo = list(entry_points)
    while todo:
        module = todo.pop()
        if module in seen or _is_dev_only(module) or _path_of(module) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # importing a.b.c runs a and a.b
        todo.extend(_imports(_path_of(module), module))
    return seen


def bundle_files(spec: BundleSpec) -> list[Path]:
    """The bundle's files, as the repository names them (relative to its root), sorted."""
    files = set()
    for module in module_closure(spec.entry_points):
        top = module.split(".")[0]
        files.add(Path(top) / _path_of(module).relative_to(source_dir(top)))
    for pattern in spec.data:
        top, _, rest = pattern.partition("/")
        files.update(Path(top) / p.relative_to(source_dir(top)) for p in source_dir(top).glob(rest))
    return sorted(files)


def stage_bundle(outdir: str | Path, spec: BundleSpec = SERVING) -> Path:
    """The bundle as one directory (a CDK asset takes one path) under the assembly's `outdir`, built once."""
    key = (str(Path(outdir).resolve()), spec)
    if key in _built and _built[key].is_dir():
        return _built[key]
    _built[key] = stage_files(outdir, spec.name, tuple(rel.as_posix() for rel in bundle_files(spec)))
    return _built[key]


# Each staged directory by (assembly, name, files): built once per assembly, whichever stacks read it (every
# provider region's reads the same image context).
_staged: dict[tuple[str, str, tuple[str, ...]], Path] = {}


def stage_files(outdir: str | Path, name: str, rels: tuple[str, ...]) -> Path:
    """Files of the repository (`rels`, by their repository names) as one directory under the assembly's `outdir`,
    once per assembly: the same tree from the repository and from an installed wheel."""
    key = (str(Path(outdir).resolve()), name, rels)
    if key in _staged and _staged[key].is_dir():
        return _staged[key]
    target = Path(outdir) / ".fleetcast-bundles" / name
    if target.exists():
        shutil.rmtree(target)
    for rel in rels:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_of(Path(rel)), target / rel)
    _staged[key] = target
    return target
