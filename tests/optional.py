"""Optional packages a test module needs, found without importing them.

Every pytest-xdist worker collects every module: a module-level `pytest.importorskip("torch")` imported PyTorch
(3 s of CPU) in each worker, for tests that run on one. A module marked with `needs_torch` is skipped where PyTorch
is not installed, and imports it where its tests run.
"""

import importlib.util

import pytest

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="the reference backend needs PyTorch (`make test` installs it)")
