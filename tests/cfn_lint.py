"""cfn-lint over synthesized templates, run in this process exactly as `cfn-lint TEMPLATE...` runs from the
repository root: the configuration comes from the same `ConfigMixIn` (so `.cfnlintrc.yaml` and its documented
ignores apply) and the matches from the same `Runner` as the CLI's `main()` (cfn-lint 1.58,
cfnlint/runner/cli.py). In-process because each CLI start spent most of its second loading the
CloudFormation resource schemas again; here they load once per test process.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint(*templates: Path | str, cwd: Path = ROOT) -> list[str]:
    """Every match cfn-lint reports on `templates`, one line each; [] when clean. Run from `cwd`, as the CLI
    would be: its .cfnlintrc.yaml (the repository's by default) applies."""
    cli = pytest.importorskip("cfnlint.runner.cli", reason="cfn-lint is installed by `make test`")
    from cfnlint.config import ConfigMixIn

    assert templates, "no templates to lint"
    with contextlib.chdir(cwd):  # where the CLI finds .cfnlintrc.yaml
        config = ConfigMixIn([str(t) for t in templates])
        runner = cli.Runner(config)
        matches = list(runner.run())
    return [f"{m.rule.id} {m.message} ({m.filename}:{m.linenumber})" for m in matches]


def assert_lint_clean(*templates: Path | str) -> None:
    problems = lint(*templates)
    assert not problems, "\n".join(problems)[-5000:]
