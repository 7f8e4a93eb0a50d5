"""The bench-mode synthesis as a fixture, for the modules that build CDK apps (test_bench_stack, test_consumer_probe).

Kept out of tests/bench/conftest.py: tests/conftest.py puts every module that imports the CDK or
tests/stacks/synthesized.py, directly or through a test helper it imports, on the one CDK worker, and a dozen
modules import conftest's `free_port` (the bench client, report and smoke tests): with the fixture in conftest
they all ran there, one after another, beside the syntheses.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def bench_app():
    """The shipped config synthesized in bench mode (providers and consumers; tests/stacks/synthesized.py
    bench_mode_fleet, shared with the stack tests); cdk-nag findings would make synth raise. Returns
    (cfg, stacks by name, cloud assembly directory)."""
    from tests.stacks.synthesized import bench_mode_fleet

    fleet = bench_mode_fleet()
    return fleet.cfg, fleet.stacks, fleet.outdir
