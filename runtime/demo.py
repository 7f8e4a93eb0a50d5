"""`make demo`: the whole instance runtime on this machine, against loopback AWS and the reference backend.

What runs for real: `python -m runtime.bootstrap` processes (one per "instance"),
the engine cache on a moto S3 server, the config from moto SSM, the reference
model servers (tiny GPT-2 shapes, CPU) behind the real gateway. Stand-ins (runtime.devtools):
IMDSv2, the Auto Scaling lifecycle-hook calls, the gateway's EC2 endpoint lookup.

Two models on one instance, one gateway, two consumers (one entitled to both models, one to one), and a
LoRA adapter of the second model (PyTorch backend), laid out in the bucket as `fleetcast stage adapter` stages it:
  1. instance A, empty cache: per model miss -> lock -> build -> upload; the adapter fetched; one engine
     process per model, started one after another with its KV budget (the adapter's base with its LoRA
     options and device cache); health -> launch hook CONTINUE; one streamed completion of each model and
     of the adapter through the gateway; GET /v1/models per consumer; the consumer not entitled to a
     model gets OpenAI's 404 model_not_found; per-model metering, the adapter metered as itself.
  2. instance B: both models hit the cache, no build; serves.
  3. scale-in of A (terminate hook): drain of every process, hook CONTINUE.
Timings (start to healthy, miss and hit) are printed at the end.

`python -m runtime.demo --concurrent N`: N instances cold-start together on an empty
cache; prints how many builds ran (one) and each instance's start-to-healthy time.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleetcast.contract import telemetry

from .devtools.harness import (
    ADAPTER_ID,
    DEMO_VPCE,
    LocalAws,
    RuntimeProcess,
    adapter_config,
    free_port_pair,
    tiny_config,
    write_peft_adapter,
)

SECOND_VPCE = "vpce-0b1c2d3e4f5a60728"


def _stream(port: int, prompt: str, max_tokens: int, model: str = "gpt2-tiny", vpce: str | None = None) -> dict[str, Any]:
    """Stream one completion through the gateway (with the NLB's PROXY v2 header), printing tokens as they come."""
    import http.client
    import json
    import socket

    from .devtools.harness import DEMO_VPCE
    from .gateway import ppv2

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(ppv2.build(vpce_id=vpce or DEMO_VPCE))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.sock = sock
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out: dict[str, Any] = {"status": resp.status, "chunks": 0, "usage": None, "ttft_ms": None, "text": ""}
    print(f"    HTTP {resp.status}; streamed text (random weights, so noise): ", end="", flush=True)
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        event = json.loads(line[5:])
        if event.get("usage"):
            out["usage"] = event["usage"]
        for choice in event.get("choices") or []:
            if choice.get("text"):
                if out["ttft_ms"] is None:
                    out["ttft_ms"] = (time.monotonic() - sent) * 1000
                out["chunks"] += 1
                out["text"] += choice["text"]
                print(repr(choice["text"])[1:-1], end="", flush=True)
    print()
    conn.close()
    return out


def which_answered(texts: dict[str, str], models: list[str], base: str, adapter: str) -> str:
    """What the streamed texts show: greedy decoding of one prompt writes the same text only on the same
    weights, so distinct texts are distinct processes, and the adapter's text matching its base's is its
    base's process answering."""
    distinct = len({texts[m] for m in models}) == len(models)
    models_line = (f"each of the {len(models)} models wrote its own text: {len(models)} engine processes, each with "
                   "its own weights" if distinct else "WARNING: two models wrote the same text")
    if texts[adapter] == texts[base]:
        return f"{models_line}; {adapter} wrote {base}'s text: {base}'s process answered it"
    return f"{models_line}; {adapter} wrote another text than {base}"


def _call(port: int, method: str, path: str, vpce: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One request through the gateway as the consumer behind VPC endpoint `vpce` (PROXY v2, as the NLB)."""
    import http.client
    import json
    import socket

    from .gateway import ppv2

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(ppv2.build(vpce_id=vpce))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.sock = sock
    conn.request(method, path, None if body is None else json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, raw = resp.status, resp.read()
    conn.close()
    return status, json.loads(raw) if raw else {}


def _metering(rp: RuntimeProcess) -> dict[tuple[str, str], dict[str, float]]:
    """The gateway's per-request EMF records (on the runtime's stdout), summed per (consumer, model)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for record in rp.emf():
        consumer, model = record.get(telemetry.DIM_CONSUMER), record.get(telemetry.DIM_MODEL)
        if not consumer or not model:
            continue
        row = out.setdefault((consumer, model), {telemetry.REQUESTS: 0.0, telemetry.INPUT_TOKENS: 0.0,
                                                 telemetry.OUTPUT_TOKENS: 0.0})
        for name in row:
            row[name] += float(record.get(name) or 0)
    return out


def _engine_memory(port: int) -> dict[str, Any]:
    """What an engine process holds (the reference server's GET /memory), read on its loopback port."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/memory", timeout=10) as resp:
        memory: dict[str, Any] = json.loads(resp.read())
    return memory


def _wait_serving(name: str, rp: RuntimeProcess, log: Path) -> dict[str, Any]:
    event = rp.wait_event("fleetcast_serving", 240)
    if event is None:
        print(f"  {name} did not reach serving; last log lines:\n" + log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit(1)
    event["wall_s"] = time.monotonic() - rp.started
    return event


def main() -> int:
    print("fleetcast demo: two models and a LoRA adapter on one instance through one gateway, on loopback AWS "
          "(moto S3/SSM, IMDSv2 + hook fakes), reference backend\n")
    work = Path(tempfile.mkdtemp(prefix="fleetcast-demo-"))
    with LocalAws() as aws:
        cfg = adapter_config()
        aws.put_config(cfg)
        base = next(m for m in cfg.models if m.adapters)
        # A PEFT directory as peft's save_pretrained writes it (placeholder weights: the reference backend checks
        # an adapter as TensorRT-LLM would load it, it does not apply it), laid out as `fleetcast stage adapter`
        # stages it.
        aws.put_adapter(cfg, base.id, ADAPTER_ID, write_peft_adapter(work / "peft", rank=8))
        both, one = cfg.consumers_of(aws.region)[:2]
        # The second consumer's endpoint: the EC2 fake answers DescribeVpcEndpointConnections with it.
        aws.ec2.connections.append({"service_id": "vpce-svc-0a1b2c3d4e5f60718", "vpce_id": SECOND_VPCE,
                                    "account": one.account, "region": one.region})
        vpce = {both.name: DEMO_VPCE, one.name: SECOND_VPCE}
        models = [m.id for m in cfg.models]
        print(f"  S3 bucket s3://{aws.bucket} at {aws.moto_url}; config in SSM {aws.param} "
              f"(fleet {cfg.name}, region {aws.region}, models {', '.join(models)})")
        print(f"  adapter {ADAPTER_ID} of {base.id} staged (LoRA rank 8, q_proj + v_proj)")
        print(f"  consumers: {both.name} may call {', '.join(cfg.models_for(both.name))}; "
              f"{one.name} may call {', '.join(cfg.models_for(one.name))}")

        # -- instance A: cold start on an empty cache
        print("\n[1] instance A starts (empty engine cache)")
        imds_a = aws.instance("i-0demo00000000000a")
        port_a = free_port_pair()
        rp_a = aws.start_runtime(aws.runtime_env(imds_a, cfg, work / "a", port_a), work / "a.log")
        a = _wait_serving("instance A", rp_a, work / "a.log")
        for model, entry in a["models"].items():
            print(f"    {model}: cache {'MISS -> built, uploaded' if entry['outcome'] == 'built' else 'HIT'} "
                  f"(key {entry['key']})")
        for p in a["processes"]:
            lora = ""
            if p["model"] == base.id:
                memory = _engine_memory(p["port"])
                lora = (f", LoRA device cache {memory.get('lora_cache_bytes')} bytes for "
                        f"{memory.get('lora_max_loras')} adapter(s) (max_loras)")
            print(f"    engine process {p['model']}#{p['copy']} on 127.0.0.1:{p['port']}, KV budget "
                  f"{p['kv_cache_bytes']} bytes{lora}")
        print(f"    every model ready (health + one real generation each), gateway /health -> launch hook "
              f"{[r for h, r in a['hooks'] if h == telemetry.LAUNCH_HOOK]}")
        status, health = _call(port_a, "GET", "/health", DEMO_VPCE)
        print(f"    gateway /health: {status} {health}")
        texts: dict[str, str] = {}
        for model in [*models, ADAPTER_ID]:
            # Each model's process holds its own random weights (runtime/backends.reference_seed), so each
            # writes its own noise; the adapter goes to its base model's process with the request's lora_request.
            via = f" (adapter of {base.id}: its lora_request checked and accepted; the reference engine does not apply the weights)" if model == ADAPTER_ID else ""
            print(f"    {both.name} streams from {model}{via} through the gateway (port {port_a}):")
            reply = _stream(port_a, "Fleetcast says hello:", 12, model=model, vpce=vpce[both.name])
            texts[model] = reply["text"]
            print(f"    usage {reply['usage']}, TTFT {reply['ttft_ms']:.1f} ms")
        print(f"    {which_answered(texts, models, base.id, ADAPTER_ID)}")
        for consumer in (both, one):
            status, listing = _call(port_a, "GET", "/v1/models", vpce[consumer.name])
            print(f"    GET /v1/models as {consumer.name}: {status} {[m['id'] for m in listing.get('data', [])]}")
        denied = next(m for m in models if m not in cfg.models_for(one.name))
        status, refusal = _call(port_a, "POST", "/v1/completions", vpce[one.name],
                                {"model": denied, "prompt": "hi", "max_tokens": 4})
        print(f"    {one.name} asks for {denied}: {status} {refusal.get('error', {}).get('code')}: "
              f"{refusal.get('error', {}).get('message')}")
        status, refusal = _call(port_a, "POST", "/v1/completions", vpce[one.name],
                                {"model": ADAPTER_ID, "prompt": "hi", "max_tokens": 4})
        print(f"    {one.name} asks for {ADAPTER_ID}: {status} {refusal.get('error', {}).get('code')}")
        status, _ = _call(port_a, "POST", "/v1/completions", vpce[one.name],
                          {"model": models[0], "prompt": "hi", "max_tokens": 4})
        print(f"    {one.name} asks for {models[0]}: {status}")

        # -- instance B: cache hit
        print("\n[2] instance B starts (same keys, cache filled by A)")
        imds_b = aws.instance("i-0demo00000000000b")
        rp_b = aws.start_runtime(aws.runtime_env(imds_b, cfg, work / "b", free_port_pair()), work / "b.log")
        b = _wait_serving("instance B", rp_b, work / "b.log")
        builds = {k.split("/builds/")[1].split("/")[0] for k in aws.keys("engines/") if "/builds/" in k}
        for model, entry in b["models"].items():
            print(f"    {model}: cache {'HIT, downloaded and verified' if entry['outcome'] != 'built' else 'MISS'}")
        print(f"    no build (builds in cache: {len(builds)}, one per model)")

        # -- scale-in of A through its terminate hook; B stops with SIGTERM
        print("\n[3] scale-in: the ASG picks instance A (terminate hook)")
        aws.asg.begin(aws.group, telemetry.TERMINATE_HOOK, imds_a.instance_id)
        imds_a.target_lifecycle_state = "Terminated"
        rp_a.proc.wait(120)
        drained = rp_a.wait_event("fleetcast_drained", 5) or {}
        print(f"    drained in {drained.get('drain_s', float('nan')):.2f} s (gateway exit {drained.get('gateway_exit')}, "
              f"engine processes {drained.get('server_exits')}); terminate hook "
              f"{[c.result for c in aws.asg.completed if c.hook == telemetry.TERMINATE_HOOK]}")
        rp_b.proc.send_signal(signal.SIGTERM)
        rp_b.proc.wait(120)

        emf_path = work / "a.emf.jsonl"  # for `python -m scripts.usage_cost_demo` (fleetcast usage --cost)
        emf_path.write_text("".join(json.dumps(record) + "\n" for record in rp_a.emf()))
        print(f"\n  metering on instance A, per consumer and model (the gateway's EMF records, {emf_path}):")
        for (consumer_name, model), row in sorted(_metering(rp_a).items()):
            print(f"    {consumer_name:16s} {model:16s} requests {row[telemetry.REQUESTS]:.0f}  input tokens "
                  f"{row[telemetry.INPUT_TOKENS]:.0f}  output tokens {row[telemetry.OUTPUT_TOKENS]:.0f}")
        print("\n  start to healthy (bootstrap start -> launch hook CONTINUE; wall = from process spawn):")
        print(f"    cache miss: {a['start_to_healthy_s']:6.2f} s   (wall {a['wall_s']:.2f} s)")
        print(f"    cache hit : {b['start_to_healthy_s']:6.2f} s   (wall {b['wall_s']:.2f} s)")
        print(f"\n  logs: {work}/a.log, {work}/b.log")
    return 0


def concurrent(n: int) -> int:
    """N instances start at once on an empty cache: one builds, the others wait and download."""
    print(f"fleetcast demo: {n} instances cold-start together on an empty engine cache (reference backend)\n")
    work = Path(tempfile.mkdtemp(prefix="fleetcast-demo-concurrent-"))
    with LocalAws() as aws:
        cfg = tiny_config()
        aws.put_config(cfg)
        procs = []
        for i in range(n):
            imds = aws.instance(f"i-0demo{i:012d}")
            procs.append(aws.start_runtime(aws.runtime_env(imds, cfg, work / f"i{i}", free_port_pair()),
                                           work / f"i{i}.log"))
        events = [_wait_serving(f"instance {i}", rp, work / f"i{i}.log") for i, rp in enumerate(procs)]
        builds = {k.split("/builds/")[1].split("/")[0] for k in aws.keys("engines/") if "/builds/" in k}
        for i, ev in enumerate(events):
            print(f"  instance {i}: {ev['outcome']:5s}  start to healthy {ev['start_to_healthy_s']:6.2f} s  "
                  f"(build {ev['build_s']:.2f} s, download {ev['download_s']:.2f} s)")
        launch = [c.result for c in aws.asg.completed if c.hook == telemetry.LAUNCH_HOOK]
        print(f"\n  builds run: {len(builds)} for {n} concurrent cold starts; launch hooks: {launch}")
        for rp in procs:
            rp.proc.send_signal(signal.SIGTERM)
        for rp in procs:
            rp.proc.wait(120)
    return 0 if len(builds) == 1 else 1


def _cli() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--concurrent" and sys.argv[2].isdigit() and int(sys.argv[2]) > 0:
        return concurrent(int(sys.argv[2]))
    if len(sys.argv) > 1:
        print("usage: python -m runtime.demo [--concurrent N]", file=sys.stderr)
        return 2
    return main()


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(_cli))
