"""TensorRT-LLM's example scripts run by absolute path still import their own `examples` package.

Newer examples/models/core/gpt/convert_checkpoint.py import `examples._deprecation` (issue 25 §5). Run as
`python3 /app/tensorrt_llm/examples/models/core/gpt/convert_checkpoint.py` with PYTHONPATH=/opt/fleetcast,
Python puts only the script's directory on sys.path, so that import fails unless the directory holding
examples/ is on the path. The stand-in below is a release-shaped examples tree whose converter does that import.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleetcast.contract.instance_env import Var
from runtime import trtllm


def release_tree(root: Path, *, regular_package: bool) -> Path:
    examples = root / "app" / "tensorrt_llm" / "examples"
    script = examples / trtllm.CONVERT_GPT
    script.parent.mkdir(parents=True)
    if regular_package:
        (examples / "__init__.py").write_text("")
    (examples / "_deprecation.py").write_text("WHERE = 'release examples'\n")
    script.write_text("from examples._deprecation import WHERE\nprint('converter imported', WHERE)\n")
    return examples


@pytest.mark.parametrize("regular_package", [True, False], ids=["examples-package", "namespace-package"])
def test_the_converter_resolves_examples_deprecation_whichever_way_the_release_ships_it(tmp_path, monkeypatch,
                                                                                     regular_package):
    examples = release_tree(tmp_path, regular_package=regular_package)
    # The runtime bundle on the path, with an `examples` directory of its own (the repo's is a namespace package).
    bundle = tmp_path / "opt" / "fleetcast"
    (bundle / "examples" / "plan").mkdir(parents=True)
    monkeypatch.setenv(Var.TRTLLM_EXAMPLES.value, str(examples))
    monkeypatch.setenv("PYTHONPATH", str(bundle))
    workdir = tmp_path / "work"  # the build's working directory, elsewhere (as on the instance)
    workdir.mkdir()
    log = tmp_path / "build.log"
    trtllm.run_logged([sys.executable, f"{trtllm.examples_dir()}/{trtllm.CONVERT_GPT}"], log, workdir)
    assert "converter imported release examples" in log.read_text()


def test_only_example_scripts_get_the_examples_root(monkeypatch):
    monkeypatch.setenv(Var.TRTLLM_EXAMPLES.value, "/app/tensorrt_llm/examples")
    env = {"PYTHONPATH": "/opt/fleetcast"}
    assert trtllm.tool_env(env, script="/app/tensorrt_llm/examples/quantization/quantize.py")["PYTHONPATH"] \
        == "/app/tensorrt_llm:/opt/fleetcast"
    # trtllm-build / trtllm-serve: nothing of the source tree may shadow the installed tensorrt_llm.
    assert trtllm.tool_env(env)["PYTHONPATH"] == "/opt/fleetcast"
    assert trtllm.tool_env(env, script="/app/tensorrt_llm/examples_other/x.py")["PYTHONPATH"] == "/opt/fleetcast"
