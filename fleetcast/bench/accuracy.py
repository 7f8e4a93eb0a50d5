"""Accuracy harness: benchmark clients against the test server's ground truth.

Used by tests/bench/test_accuracy.py (small, loose) and scripts/bench_accuracy.py
(the full check, with NVIDIA AIPerf side by side). The server runs pinned to
one core and each client run to another, so neither steals the other's CPU.

A figure is "within tolerance" when |measured - truth| <= max(2% of truth, 1 ms)
(`TOLERANCE_REL`, `TOLERANCE_ABS_MS`), comparing the client's percentile with
the same percentile of the server's emission log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetcast.bench.schema import Stat
from fleetcast.bench.stats import make_stat
from fleetcast.bench.testserver import Timings
from fleetcast.contract.packaging import cli_module

TOLERANCE_REL = 0.02
TOLERANCE_ABS_MS = 1.0
METRICS = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p50"), ("itl_ms", "p99"))


def within(measured: float | None, truth: float | None, rel: float = TOLERANCE_REL, abs_ms: float = TOLERANCE_ABS_MS) -> bool:
    if measured is None or truth is None:
        return False
    return abs(measured - truth) <= max(rel * abs(truth), abs_ms)


class TestServerProcess:
    """The test server in a child process, optionally pinned to one CPU."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, port: int, timings: Timings, cpu: int | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        self.port = port
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self._ctx = None
        if tls:
            import ssl

            self._ctx = ssl.create_default_context(cafile=tls[0])
        cmd = [sys.executable, "-m", "fleetcast.bench.testserver", "--port", str(port),
               "--ttft-ms", str(timings.ttft_ms), "--ttft-jitter-ms", str(timings.ttft_jitter_ms),
               "--itl-ms", str(timings.itl_ms), "--itl-jitter-ms", str(timings.itl_jitter_ms),
               "--spike-prob", str(timings.spike_prob), "--spike-ms", str(timings.spike_ms),
               "--seed", str(timings.seed), "--fail-prob", str(timings.fail_prob)]
        if timings.max_output_tokens is not None:
            cmd += ["--max-output-tokens", str(timings.max_output_tokens)]
        for model, ttft, itl in timings.models:
            cmd += ["--serve-model", f"{model}={ttft}/{itl}"]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        if tls:
            cmd += ["--tls-cert", tls[0], "--tls-key", tls[1]]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read() if self.proc.stderr is not None else b""  # PIPE above: set
                raise RuntimeError(f"test server exited: {stderr.decode()[-500:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1, context=self._ctx):
                    return
            except OSError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError("test server did not start within 20 s")

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.url}/_truth/reset", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=10, context=self._ctx):
            pass

    def truth(self) -> list[dict[str, Any]]:
        """Per-request truth of the streamed requests since the last reset."""
        with urllib.request.urlopen(f"{self.url}/_truth", timeout=30, context=self._ctx) as resp:
            return [r for r in json.load(resp) if r.get("stream") and r.get("output_tokens")]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> TestServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def truth_stats(truth: list[dict[str, Any]]) -> dict[str, Stat]:
    return {
        "ttft_ms": make_stat(r.get("ttft_ms") for r in truth),
        "itl_ms": make_stat(r.get("itl_ms") for r in truth),
    }


@dataclass
class ToolResult:
    """One tool's P50/P99 TTFT and ITL for one run, and whether it flagged itself."""

    figures: dict[tuple[str, str], float | None]
    requests: int
    saturated: bool | None = None  # None: the tool has no such notion
    note: str = ""
    run_queue_wait_p99_ms: float | None = None  # the client's own, where the tool measures it (fleetcast's, schedstat)


def run_fleetcast(url: str, concurrency: int, requests: int, input_tokens: int, output_tokens: int,
                  cpu: int | None = None, timeout_s: float = 600) -> ToolResult:
    """`fleetcast bench run` in a child process (its own interpreter, pinned like AIPerf would be)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", cli_module(), "bench", "run", "--endpoint", url,
               "--concurrency", str(concurrency), "--requests-per-level", str(requests), "--warmup", "0",
               "--input-tokens", str(input_tokens), "--output-tokens", str(output_tokens),
               "--out", str(out), "--quiet"]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        subprocess.run(cmd, check=True, timeout=timeout_s, cwd=_repo_root())
        data = json.loads(out.read_text())
    s = data["runs"][0]["summary"]
    figures = {(m, q): s[m][q] for m, q in METRICS}
    waits = s.get("client_run_queue_wait_ms") or {}
    return ToolResult(figures, s["completed"], s["saturated"], s.get("saturation_reason") or "", waits.get("p99"))


def run_aiperf(aiperf: str, url: str, model: str, concurrency: int, requests: int, input_tokens: int,
               output_tokens: int, tokenizer_dir: str, cpu: int | None = None, timeout_s: float = 900) -> ToolResult:
    """NVIDIA AIPerf against the same server; parses its JSON export."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
               "--concurrency", str(concurrency), "--request-count", str(requests),
               "--prompt-input-tokens-mean", str(input_tokens), "--prompt-input-tokens-stddev", "0",
               "--prompt-output-tokens-mean", str(output_tokens), "--prompt-output-tokens-stddev", "0",
               "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{output_tokens}",
               "--tokenizer", tokenizer_dir, "--use-server-token-count",
               "--output-artifact-dir", tmp, "--ui-type", "none", "--random-seed", "0"]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu)] + cmd
        # Not HF_HUB_OFFLINE: AIPerf 0.13 then resolves every name through the hub cache and
        # rejects a local directory; with a local path it never reaches the network.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        exports = list(Path(tmp).rglob("profile_export_aiperf.json"))
        if proc.returncode != 0 or not exports:
            raise RuntimeError(f"aiperf failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        data = json.loads(exports[0].read_text())
    figures = {}
    for metric, key in (("ttft_ms", "time_to_first_token"), ("itl_ms", "inter_token_latency")):
        entry = _find_metric(data, key)
        for q in ("p50", "p99"):
            figures[(metric, q)] = _to_ms(entry, q) if entry else None
    count = _find_metric(data, "request_count")
    n = int(count.get("avg", 0)) if isinstance(count, dict) else requests
    return ToolResult(figures, n, None, "")


def _find_metric(data: object, key: str) -> dict[str, Any] | None:
    if isinstance(data, dict):
        if key in data and isinstance(data[key], dict):
            found: dict[str, Any] = data[key]
            return found
        for v in data.values():
            hit = _find_metric(v, key)
            if hit is not None:
                return hit
    elif isinstance(data, list):
        for v in data:
            if isinstance(v, dict) and (v.get("tag") == key or v.get("name") == key):
                return v
            hit = _find_metric(v, key)
            if hit is not None:
                return hit
    return None


def _to_ms(entry: dict[str, Any], q: str) -> float | None:
    value = entry.get(q)
    if value is None:
        return None
    unit = str(entry.get("unit", "ms")).lower()
    return float(value) * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0}.get(unit, 1.0)


def build_tiny_tokenizer(out_dir: Path) -> Path:
    """A tiny byte-level BPE tokenizer directory (tokenizer.json, tokenizer_config.json,
    config.json) for offline tools that insist on a Hugging Face tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from fleetcast.bench.prompts import WORDS

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
    (out_dir / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": tok.get_vocab_size()}))
    return out_dir


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])
