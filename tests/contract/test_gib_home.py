"""GiB (2**30 bytes) has one home, fleetcast.contract.serving.GIB: project code divides or multiplies by that
name, never by a literal of its own (checked on the source with `ast`). bench/*.py are left out: they run alone
on a bare GPU host, without fleetcast on the path."""

from __future__ import annotations

import ast
from pathlib import Path

from fleetcast.contract.serving import GIB

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "fleetcast" / "contract" / "serving.py"


def _gib_literals(tree: ast.AST) -> list[int]:
    """Line numbers of 2**30, 1 << 30 and 1073741824 written out."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant):
            a, b = node.left.value, node.right.value
            if (isinstance(node.op, ast.Pow) and (a, b) == (2, 30)) or (isinstance(node.op, ast.LShift) and (a, b) == (1, 30)):
                found.append(node.lineno)
        elif isinstance(node, ast.Constant) and node.value == GIB and type(node.value) is int:
            found.append(node.lineno)
    return found


def test_the_home_spells_it():
    assert GIB == 1024**3 and _gib_literals(ast.parse(HOME.read_text()))


def test_no_project_module_spells_a_gib_of_its_own():
    spelt = []
    for top in ("fleetcast", "runtime", "stacks", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == HOME:
                continue
            spelt += [f"{path.relative_to(ROOT)}:{line}" for line in _gib_literals(ast.parse(path.read_text()))]
    assert spelt == [], "import GIB from fleetcast.contract.serving instead: " + ", ".join(spelt)
