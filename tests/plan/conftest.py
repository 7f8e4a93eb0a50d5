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
