"""cfn-lint over synthesized templates, run in this process exactly as `cfn-lint TEMPLATE...` runs from the
repository root: the configuration comes from the same `ConfigMixIn` (so `.cfnlintrc.yaml` and its documented
ignores apply) and the matches from the same `Runner` as the CLI's `main()` (cfn-lint 1.58,
cfnlint/runner/cli.py). In-process because each CLI start spent most of its second loading the
CloudFormation resource schemas again; here they load once per test process.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# What a run reported, by what it read: the templates' names and bytes and the .cfnlintrc.yaml that applied. Tests
# that share a synthesis (tests/stacks/synthesized.py) lint the same files; cfn-lint spends seconds per provider
# template, and the same bytes under the same settings get the same matches.
_reported: dict[tuple, list[str]] = {}


def lint(*templates: Path | str, cwd: Path = ROOT) -> list[str]:
    """Every match cfn-lint reports on `templates`, one line each; [] when clean. Run from `cwd`, as the CLI
    would be: its .cfnlintrc.yaml (the repository's by default) applies."""
    rc = Path(cwd) / ".cfnlintrc.yaml"
    key = (str(Path(cwd).resolve()), rc.read_bytes() if rc.is_file() else None,
           tuple((str(Path(t).resolve()), Path(t).read_bytes()) for t in templates))
    if key not in _reported:
        _reported[key] = _run(*templates, cwd=cwd)
    return list(_reported[key])


# The rule set a run's configuration loads (cfnlint.runner.cli.Runner._get_rules: the built-in rules plus any
# `append_rules` and `custom_rules`), by those two settings. Loading it walks and instantiates every rule module;
# the CLI loads it once and runs it over each of its templates in turn (Runner.run), every run configuring each
# rule from that run's settings and initializing it on the template (Rules.run). Runs here share it the same way:
# 8 runs over the default fleet's templates took 16.6 s of CPU loading it each time, 11.1 s sharing it.
_rule_sets: dict[tuple, object] = {}


def _where(rules: str | None) -> str | None:
    """A rules directory or file by its absolute path (a relative one is the run's cwd's), a module by its name."""
    return os.path.abspath(os.path.expanduser(rules)) if rules and os.path.exists(os.path.expanduser(rules)) else rules


def _runner(cli, config):
    class Runner(cli.Runner):
        def _get_rules(self) -> None:
            key = (tuple(map(_where, self.config.append_rules)), _where(self.config.custom_rules))
            if key not in _rule_sets:
                super()._get_rules()
                _rule_sets[key] = self.rules
            self.rules = _rule_sets[key]

    return Runner(config)


def _run(*templates: Path | str, cwd: Path) -> list[str]:
    cli = pytest.importorskip("cfnlint.runner.cli", reason="cfn-lint is installed by `make test`")
    from cfnlint.config import ConfigMixIn

    assert templates, "no templates to lint"
    with contextlib.chdir(cwd):  # where the CLI finds .cfnlintrc.yaml
        config = ConfigMixIn([str(t) for t in templates])
        runner = _runner(cli, config)
        matches = list(runner.run())
    return [f"{m.rule.id} {m.message} ({m.filename}:{m.linenumber})" for m in matches]


def assert_lint_clean(*templates: Path | str) -> None:
    problems = lint(*templates)
    assert not problems, "\n".join(problems)[-5000:]
