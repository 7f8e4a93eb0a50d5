"""The runtime runs in the serving image's interpreter, not this venv's: keep it Python 3.10+ and TensorRT-LLM-free."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
OWN = sorted(p for p in RUNTIME.rglob("*.py") if "reference" not in p.parts and "gateway" not in p.parts)


@pytest.mark.parametrize("path", OWN, ids=lambda p: str(p.relative_to(RUNTIME)))
def test_parses_as_python_3_10(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_importable_without_tensorrt_llm_or_cdk():
    code = ("import sys; sys.modules['tensorrt_llm'] = None; sys.modules['aws_cdk'] = None; "
            "import runtime.bootstrap, runtime.trtllm, runtime.engine_cache, runtime.userdata, runtime.demo")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=RUNTIME.parent)
