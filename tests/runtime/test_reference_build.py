"""runtime.reference.build: the reference backend's artifact is real, deterministic and checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.reference import build as build_mod
from runtime.reference.build import build_artifact, load_weights, read_config
from runtime.reference.configs import SIZES, shape_for
from runtime.reference.tokenizer import ByteTokenizer, StreamDecoder
from tests.optional import needs_torch

from .reference_helpers import ROOT

pytestmark = needs_torch


def test_same_seed_gives_byte_identical_files_and_another_seed_other_weights(tmp_path):
    a = build_artifact(tmp_path / "a", size="tiny", seed=7)
    b = build_artifact(tmp_path / "b", size="tiny", seed=7)
    c = build_artifact(tmp_path / "c", size="tiny", seed=8)
    assert a["files"] == b["files"]
    assert a["sha256"] == b["sha256"]
    assert c["sha256"]["model.safetensors"] != a["sha256"]["model.safetensors"]
    assert c["sha256"]["tokenizer.json"] == a["sha256"]["tokenizer.json"]


def test_artifact_holds_weights_config_and_tokenizer_for_the_shape(tmp_path):
    result = build_artifact(tmp_path / "art", size="tiny", seed=0)
    assert set(result["files"]) == {"model.safetensors", "config.json", "tokenizer.json",
                                    "tokenizer_config.json", "special_tokens_map.json"}
    assert result["bytes"] == sum((tmp_path / "art" / f).stat().st_size for f in result["files"])
    config = read_config(tmp_path / "art")
    shape = shape_for("tiny")
    assert (config["model_type"], config["n_layer"], config["n_embd"], config["vocab_size"]) == (
        "gpt2", shape.n_layer, shape.n_embd, shape.vocab_size)
    weights = load_weights(tmp_path / "art")
    assert sum(t.numel() for t in weights.values()) == shape.param_count()
    assert weights["transformer.h.0.attn.c_attn.weight"].shape == (shape.n_embd, 3 * shape.n_embd)


def test_gpt2_xl_shape_has_the_published_parameter_count():
    assert shape_for("gpt2-xl").param_count() == 1_557_611_200
    assert SIZES["gpt2-xl"].n_head == 25 and SIZES["gpt2-xl"].n_layer == 48


def test_torch_save_is_used_when_safetensors_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "_have_safetensors", lambda: False)
    result = build_artifact(tmp_path / "art", size="tiny", seed=3)
    assert "pytorch_model.bin" in result["files"]
    monkeypatch.undo()
    reference = load_weights(build_artifact(tmp_path / "st", size="tiny", seed=3)["dir"])
    fallback = load_weights(tmp_path / "art")
    import torch

    assert all(torch.equal(reference[k], fallback[k]) for k in reference)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"size": "gpt5"}, "size"), ({"dtype": "int3"}, "dtype"), ({"seed": -1}, "seed"), ({"device": "tpu"}, "device")],
)
def test_bad_arguments_are_refused_naming_the_argument(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        build_artifact(tmp_path / "x", **{"size": "tiny", "seed": 0, **kwargs})


def test_an_existing_artifact_is_never_overwritten(tmp_path):
    build_artifact(tmp_path / "art", size="tiny", seed=0)
    with pytest.raises(FileExistsError, match="already holds an artifact"):
        build_artifact(tmp_path / "art", size="tiny", seed=1)


def test_cli_prints_the_file_list_and_reports_errors_in_one_line(tmp_path, capsys):
    # `python -m runtime.reference.build` is `sys.exit(main())`; main runs here (the bootstrap tests run the module).
    assert build_mod.main(["--out", str(tmp_path / "a"), "--size", "tiny"]) == 0
    assert "model.safetensors" in json.loads(capsys.readouterr().out)["files"]
    assert build_mod.main(["--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out_dir:") and "Traceback" not in err


def test_byte_tokenizer_round_trips_text_and_streams_multibyte_characters():
    tok = ByteTokenizer()
    text = "héllo, 世界 🚀"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and tok.decode(ids) == text
    dec = StreamDecoder()
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) + dec.flush() == text
    assert "" in pieces  # a partial character waits for its remaining bytes


def test_tokenizer_json_is_loadable_by_hugging_face_tokenizers_with_the_same_ids(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    build_artifact(tmp_path / "art", size="tiny", seed=0)
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "art" / "tokenizer.json"))
    text = "The fox said: héllo 世界"
    assert hf.encode(text).ids == ByteTokenizer().encode(text)
    assert hf.decode(ByteTokenizer().encode(text)) == text


def test_modules_import_without_torch_and_fail_clearly_when_torch_is_needed(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import runtime.reference.server, runtime.reference.configs, runtime.reference.tokenizer\n"
        "from runtime.reference.build import build_artifact\n"
        "try:\n"
        f"    build_artifact({str(tmp_path / 'a')!r}, size='tiny', seed=0)\n"
        "except RuntimeError as exc:\n"
        "    print('BUILD:', exc)\n"
        f"rc = runtime.reference.server.main(['--artifact', {str(tmp_path)!r}])\n"
        "print('SERVER RC:', rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "BUILD: the reference backend needs PyTorch" in proc.stdout
    assert "SERVER RC: 2" in proc.stdout
    assert "needs PyTorch" in proc.stderr
