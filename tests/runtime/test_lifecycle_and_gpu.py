"""IMDSv2, lifecycle-hook calls and heartbeats, GPU detection, and the TRT-LLM build driver."""

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from fleetcast.config import KvCacheDtype, Precision, load_config
from fleetcast.contract.telemetry import LAUNCH_HOOK
from runtime import gpu, trtllm
from runtime.devtools.fakes import FakeAutoScaling, FakeImds
from runtime.lifecycle import ABANDON, CONTINUE, Heartbeat, HookClient, Imds, MetadataError, heartbeat_interval

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def imds():
    fake = FakeImds(instance_id="i-0abc", region="ap-northeast-2", asg_name="fleetcast-asg",
                    target_lifecycle_state="Warmed:Stopped").start()
    yield fake
    fake.stop()


@pytest.fixture
def asg():
    fake = FakeAutoScaling().start()
    yield fake
    fake.stop()


def test_imds_v2_token_then_metadata_and_asg_name_from_tags(imds):
    client = Imds(imds.url)
    assert client.instance_id() == "i-0abc"
    assert client.asg_name() == "fleetcast-asg"
    assert client.target_lifecycle_state() == "Warmed:Stopped"
    assert imds.token_requests == 1  # one session token, reused


def test_imds_without_metadata_tags_says_what_to_enable(imds):
    imds.tags.clear()
    with pytest.raises(MetadataError, match="InstanceMetadataTags"):
        Imds(imds.url).asg_name()


def test_imds_v1_style_requests_are_refused_by_the_fake():
    """The fake enforces IMDSv2 like a hardened instance, so the client is proven to send tokens."""
    import urllib.error
    import urllib.request

    fake = FakeImds().start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{fake.url}/latest/meta-data/instance-id", timeout=2)
        assert err.value.code == 401
    finally:
        fake.stop()


def test_unreachable_imds_is_a_clear_error():
    from runtime.devtools.harness import free_port

    with pytest.raises(MetadataError, match="unreachable"):
        Imds(f"http://127.0.0.1:{free_port()}", attempts=2, timeout_s=0.2).instance_id()


def _client(asg):
    return boto3.client("autoscaling", region_name="ap-northeast-2", endpoint_url=asg.url,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def test_hook_completion_and_heartbeats_reach_auto_scaling(asg):
    asg.begin("fleetcast-asg", LAUNCH_HOOK, "i-0abc")
    hooks = HookClient(_client(asg), "fleetcast-asg", "i-0abc")
    with Heartbeat(lambda: hooks.heartbeat(LAUNCH_HOOK), interval_s=0.05) as beat:
        time.sleep(0.4)  # a "long build"
    assert beat.count >= 3 and len(asg.heartbeats) == beat.count
    hooks.complete(LAUNCH_HOOK, CONTINUE)
    assert asg.results(LAUNCH_HOOK) == ["CONTINUE"]
    hooks.complete(LAUNCH_HOOK, ABANDON)  # already completed: logged, not raised
    assert asg.results(LAUNCH_HOOK) == ["CONTINUE"]
    with pytest.raises(ValueError):
        hooks.complete(LAUNCH_HOOK, "MAYBE")


def test_heartbeat_interval_stays_inside_the_hook_window():
    for window in (30, 300, 3600, 7200):
        assert 10 <= heartbeat_interval(window) <= window / 2 or window < 30
        assert heartbeat_interval(window) <= 600


def test_nvidia_smi_parsing():
    info = gpu.parse_nvidia_smi("NVIDIA L40S, 8.9, 46068\n")
    assert (info.name, info.compute_capability, info.arch, info.count) == ("NVIDIA L40S", "8.9", "sm89", 1)
    assert gpu.parse_nvidia_smi("NVIDIA H200, 9.0, 143771\nNVIDIA H200, 9.0, 143771").count == 2
    with pytest.raises(gpu.GpuError, match="mixed"):
        gpu.parse_nvidia_smi("NVIDIA A10G, 8.6, 23028\nNVIDIA L4, 8.9, 23034")
    with pytest.raises(gpu.GpuError, match="no GPU"):
        gpu.parse_nvidia_smi("")
    with pytest.raises(gpu.GpuError, match="unexpected"):
        gpu.parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_trtllm_build_runs_convert_then_build_and_ships_the_tokenizer(tmp_path):
    cfg = load_config(REPO / "config" / "fleet.yaml")
    engine = cfg.engine.model_copy(update={"precision": Precision.INT8_SMOOTHQUANT, "kv_cache_dtype": KvCacheDtype.INT8})
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "vocab.json", "merges.txt", "model.safetensors"):
        (model / name).write_text(name)
    calls = []

    def runner(cmd, log, cwd):
        calls.append(cmd)
        assert cwd == tmp_path / "work"  # each step runs in the build's own directory
        if cmd[0] == "trtllm-build":
            out = Path(cmd[cmd.index("--output_dir") + 1])
            out.mkdir(parents=True)
            (out / "config.json").write_text("{}")
            (out / "rank0.engine").write_bytes(b"engine")

    artifact = trtllm.TrtllmBackend(cfg, engine, runner=runner).build(model, tmp_path / "calib", tmp_path / "work")
    assert [c[0] for c in calls] == ["python3", "trtllm-build"]
    assert "--smoothquant" in calls[0] and "--int8_kv_cache" in calls[0]
    assert sorted(p.name for p in (artifact / "tokenizer").iterdir()) == ["config.json", "merges.txt", "tokenizer.json", "vocab.json"]
    assert (artifact / "engine" / "rank0.engine").read_bytes() == b"engine"
    assert not (tmp_path / "work" / "checkpoint").exists()  # the intermediate checkpoint is not cached


def test_trtllm_build_without_an_engine_fails_instead_of_caching_nothing(tmp_path):
    cfg = load_config(REPO / "config" / "fleet.yaml")
    (tmp_path / "model").mkdir()
    backend = trtllm.TrtllmBackend(cfg, cfg.engine, runner=lambda cmd, log, cwd: None)
    with pytest.raises(RuntimeError, match="no config.json/rank"):
        backend.build(tmp_path / "model", None, tmp_path / "work")


def test_a_failing_build_step_reports_its_output(tmp_path):
    log = tmp_path / "build.log"
    with pytest.raises(RuntimeError, match="bash exited 2: .*out of memory"):
        trtllm.run_logged(["bash", "-c", "echo 'CUDA error: out of memory'; exit 2"], log)
    assert "$ bash -c" in log.read_text() and "# exit 2" in log.read_text()


def test_pytorch_backend_caches_the_checkpoint_and_wants_fp8_prequantized(tmp_path):
    from fleetcast.config import Backend, ModelFamily
    from fleetcast.contract.errors import UserError

    cfg = load_config(REPO / "config" / "fleet.yaml")
    cfg = cfg.model_copy(update={"models": (cfg.model.model_copy(update={"family": ModelFamily.LLAMA}),)})
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w")
    bf16 = cfg.engine.model_copy(update={"backend": Backend.PYTORCH, "precision": Precision.BF16})
    artifact = trtllm.TrtllmBackend(cfg, bf16, runner=lambda c, log, w: pytest.fail("no build step")).build(
        model, None, tmp_path / "w1")
    assert sorted(p.name for p in artifact.iterdir()) == ["config.json", "model.safetensors"]
    fp8 = bf16.model_copy(update={"precision": Precision.FP8})
    with pytest.raises(UserError, match="pre-quantized"):
        trtllm.TrtllmBackend(cfg, fp8).build(model, None, tmp_path / "w2")
    (model / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}}))
    assert (trtllm.TrtllmBackend(cfg, fp8).build(model, None, tmp_path / "w3") / "hf_quant_config.json").is_file()


def test_a_hung_build_step_is_killed_after_its_timeout(tmp_path):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish within 1 s"):
        trtllm.run_logged(["bash", "-c", "echo converting; sleep 60"], tmp_path / "build.log", timeout_s=1)
    assert time.monotonic() - started < 30  # killed, not the step's own 60 s; bounded generously for a loaded host


# Generous bounds on waits for real events (a file written, a SIGKILL landing): a loaded machine makes them slower,
# never makes them wrong, and a passing run returns as soon as the event happens.
EVENT_DEADLINE_S = 60.0


def _wait_for(event: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + EVENT_DEADLINE_S
    while not event():
        assert time.monotonic() < deadline, f"{what} did not happen within {EVENT_DEADLINE_S:.0f} s"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    """Exited: no such process, or dead and not yet reaped by whoever inherited it."""
    return _process_state(pid) in (None, "Z")


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_build_step_stopped_from_outside_takes_its_processes_with_it(tmp_path):
    """The Spot path: the notice's SIGUSR1 handler raises in the main thread while a step runs. The step's whole
    process group (the tool and what it started) is killed before the exception leaves run_logged."""
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; wait"  # renamed: read whole or not at all
    seen: list[str] = []

    def interrupted(_signum, _frame):
        raise InterruptedError("spot notice")

    def notify_when_started():
        try:
            _wait_for(pids.exists, "the step writing its pids")
        except AssertionError as exc:
            seen.append(str(exc))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupted)
    try:
        notifier = threading.Thread(target=notify_when_started, daemon=True)
        notifier.start()
        with pytest.raises(InterruptedError):
            trtllm.run_logged(["bash", "-c", script], tmp_path / "build.log")
        notifier.join(EVENT_DEADLINE_S)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not seen, seen[0] if seen else ""
    shell, sleeper = map(int, pids.read_text().split())
    assert _gone(shell), f"the step's shell {shell} is still running once run_logged has returned"
    # The background sleep was killed with its group; SIGKILL lands when it is next scheduled, left alive it sleeps 60 s.
    _wait_for(lambda: _gone(sleeper), f"the SIGKILL of the step's child {sleeper}")


def test_a_step_stopped_while_popen_is_still_starting_it_is_killed_too(tmp_path, monkeypatch):
    """The exception can land after the fork but before Popen returns (reading its exec pipe, say): the step is
    already running and must be killed with its group although run_logged never got its Popen object."""
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; wait"
    forked = trtllm._StepProcess._execute_child

    def interrupted_after_fork(self, *args, **kwargs):
        forked(self, *args, **kwargs)
        _wait_for(pids.exists, "the step writing its pids")  # its child is started too: the group must take it
        raise InterruptedError("spot notice inside Popen")

    monkeypatch.setattr(trtllm._StepProcess, "_execute_child", interrupted_after_fork)
    with pytest.raises(InterruptedError):
        trtllm.run_logged(["bash", "-c", script], tmp_path / "build.log")
    shell, sleeper = map(int, pids.read_text().split())
    assert _gone(shell), f"the step's shell {shell} is still running once run_logged has returned"
    _wait_for(lambda: _gone(sleeper), f"the SIGKILL of the step's child {sleeper}")


def _process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
