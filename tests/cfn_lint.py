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


# What cfn-lint reported on each template, by what it read: the template's bytes and the .cfnlintrc.yaml that
# applied (and the directory it ran from). The CLI lints each of its templates on its own (cfnlint.runner.template:
# run_template_by_file_paths decodes and runs the rules over one file at a time, its matches that file's), so one
# template's findings do not depend on the others named with it, nor on its file's name: tests that synthesize the
# same template (the default fleet's, in the platform app; a shared fleet read by several modules) lint it once per
# process, whichever set of files each names. A provider template costs 2-3 s of CPU to lint.
_reported: dict[tuple, list[tuple[str, str, int]]] = {}


def _key(template: Path | str, cwd: Path) -> tuple:
    rc = Path(cwd) / ".cfnlintrc.yaml"
    return str(Path(cwd).resolve()), rc.read_bytes() if rc.is_file() else None, Path(template).read_bytes()


def lint(*templates: Path | str, cwd: Path = ROOT) -> list[str]:
    """Every match cfn-lint reports on `templates`, one line each, template by template; [] when clean. Run from
    `cwd`, as the CLI would be: its .cfnlintrc.yaml (the repository's by default) applies."""
    assert templates, "no templates to lint"
    keys = [_key(t, cwd) for t in templates]
    todo = {key: str(t) for t, key in zip(templates, keys) if key not in _reported}
    if todo:
        found: dict[str, list[tuple[str, str, int]]] = {path: [] for path in todo.values()}
        for rule, message, filename, line in _run(*todo.values(), cwd=cwd):
            found[filename].append((rule, message, line))
        for key, path in todo.items():
            _reported[key] = found[path]
    return [f"{rule} {message} ({t}:{line})" for t, key in zip(templates, keys) for rule, message, line in _reported[key]]


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


def _run(*templates: str, cwd: Path) -> list[tuple[str, str, str, int]]:
    """(rule id, message, file, line) of every match, from one run over `templates` as the CLI's own."""
    cli = pytest.importorskip("cfnlint.runner.cli", reason="cfn-lint is installed by `make test`")
    from cfnlint.config import ConfigMixIn

    with contextlib.chdir(cwd):  # where the CLI finds .cfnlintrc.yaml
        config = ConfigMixIn(list(templates))
        runner = _runner(cli, config)
        matches = list(runner.run())
    return [(m.rule.id, m.message, m.filename, m.linenumber) for m in matches]


def assert_lint_clean(*templates: Path | str) -> None:
    problems = lint(*templates)
    assert not problems, "\n".join(problems)[-5000:]
