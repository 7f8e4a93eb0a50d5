"""Small doc truths: README names the stack outputs the templates have; docs cite files the repo has;
published notes carry no internal tracker references."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench" / "data").glob("*.md"))]


def test_every_stack_output_the_readme_names_is_one_a_template_has():
    from tests.stacks.synthesized import default_fleet, spill_fleet

    # The default fleet, and the spill example for what only spill and failover add (FailoverRecordName).
    outputs = {key for fleet in (default_fleet(), spill_fleet()) for path in fleet.template_files()
               for key in __import__("json").loads(path.read_text()).get("Outputs", {})}
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`(\w+)` output", text)) | set(re.findall(r"output `(\w+)`", text))
    assert "EndpointServiceName" in named
    assert named <= outputs, f"README names outputs no template has: {sorted(named - outputs)}"


def test_docs_cite_only_markdown_files_the_repo_has():
    present = {p.name for p in ROOT.rglob("*.md") if "node_modules" not in p.parts and ".venv" not in p.parts}
    for doc in DOCS:
        cited = set(re.findall(r"(?<![\w./-])([\w-][\w.-]*\.md)\b", doc.read_text()))
        assert cited <= present, f"{doc.relative_to(ROOT)} cites {sorted(cited - present)}, not in the repo"


def test_published_notes_carry_no_internal_issue_references():
    for doc in [*DOCS, ROOT / "bench" / "h200_sweep.sh"]:
        hits = re.findall(r"\bissue \d+(?: item \d+)?", doc.read_text())
        assert not hits, f"{doc.relative_to(ROOT)}: {hits}"
