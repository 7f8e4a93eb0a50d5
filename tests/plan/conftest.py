"""Shared inputs for the plan tests: the committed seed scenario (synthetic data)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "plan" / "seed"


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch):
    # Nothing here may reach AWS: dummy credentials, and clients are always stubbed.
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)


EAST_WEST_MIX = '{"1-16": 0.80, "32": 0.15, "64": 0.05}'


def east_and_west_traffic(tmp_path, east: str, west: str, extra: str = "") -> Path:
    """A two-consumer profile, us-east-1 and us-west-2, at these hourly rates; `extra` replaces the concurrency
    mix line (e.g. "burstiness: 1.2": arrivals-based sizing)."""
    path = tmp_path / "traffic.yaml"
    shape = extra or "concurrency: " + EAST_WEST_MIX
    path.write_text(f"""schema: fleetcast.traffic/v1
name: east-and-west
consumers:
  - region: us-east-1
    rate_rps: {east}
    {shape}
    input_tokens: 256
    output_tokens: 128
  - region: us-west-2
    rate_rps: {west}
    {shape}
    input_tokens: 256
    output_tokens: 128
""")
    return path


def keep_figures(monkeypatch, rasterize: bool = True) -> dict:
    """Figures as they are saved, by file name, so a test reads what a plot draws rather than its pixels.
    `rasterize=False`: each file is a placeholder, as with the `unrasterized` fixture (rasterizing is most of a
    report's CPU), for a test that reads only the figures; tests/plan/test_cli.py::test_report_files_and_json and
    test_packing_of_one_report.py's `written` write the pictures themselves and check they are PNGs."""
    from matplotlib.figure import Figure

    saved: dict = {}
    real = Figure.savefig

    def keep(fig, path, *a, **k):
        saved[Path(path).name] = fig
        if not rasterize:
            Path(path).write_bytes(b"")
            return None
        return real(fig, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def write_plan(path, result, ctx, plans=None, *, allow_estimated: bool = False, write_schedule: bool = False,
               write_spot: bool = False) -> list[str]:
    """`plan --write-config` as the command runs it (run.Planned.edit, one path for one model or several), the file
    replaced: what changed, then what was left unwritten."""
    from fleetcast.plan.run import Planned

    edit = Planned(result, ctx).edit(str(path), allow_estimated, write_schedule, write_spot)
    if edit.text is not None:
        Path(path).write_text(edit.text)
    return edit.changes + edit.notes
