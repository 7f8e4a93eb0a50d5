"""Cross-region spill on loopback, every part a process of its own (issue 36, "Done when"): the home gateway
(us-east-1), the remote gateway (us-west-2), one fake engine behind each, and between the two gateways a
delaying TCP proxy standing in for the inter-region path: the provider's cross-region interface endpoint and
the remote NLB, which puts the PROXY v2 header naming the provider's own endpoint in front of each connection
(the NLB's proxy protocol v2 with the PrivateLink TLV, docs/gateway.md).

AWS behaviour these stand-ins assume, from its documentation:
- Cross-region PrivateLink: an interface endpoint in one region connects to an endpoint service in another
  (AWS PrivateLink guide, "Cross-region connectivity", https://docs.aws.amazon.com/vpc/latest/privatelink/
  privatelink-share-your-services.html#endpoint-service-cross-region: "the service consumer can ... access
  the endpoint service from a different Region"); the owner of that endpoint is the provider account, which is
  what DescribeVpcEndpointConnections reports as VpcEndpointOwner for the spill endpoint's connection.
- The NLB sends PROXY v2 with the VPC endpoint id TLV on PrivateLink connections (Elastic Load Balancing,
  Network Load Balancers, "Proxy protocol": "the VPC endpoint ID ... type 0xEA"), which is how the remote
  gateway tells the provider's spill endpoint from a consumer's endpoint.

The tests are bounded (every wait has a ceiling) and load-independent: the home engine holds one request at a
time (max_batch_size 1) and a long stream occupies it, so the home gateway's predicted wait (a full engine,
one service time) is far above the 300 ms SLO whatever the machine's load; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime.devtools.harness import free_port
from runtime.gateway.fair import read_queue_state
from runtime.gateway.peer import PEER_HEADER, sign
from runtime.gateway.spill import HEADROOM_PATH
from scripts.bench_balance import Child as Proc  # a process whose stdout lines are collected as they come
from scripts.bench_gateway import FakeEc2Endpoints
from scripts.bench_overflow_replay import (
    SPILL_VPCE,  # the provider's own endpoint in us-east-1 to the us-west-2 service
    RegionPath as DelayingProxy,  # the inter-region path, as the bench has it
)

from .fakes import Client, completion_text

# Gateways and fake engines as forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = pytest.mark.usefixtures("forked_gateways")

ROOT = Path(__file__).resolve().parents[2]
KEY = b"k" * 48
PROVIDER = "111122223333"
CHECKOUT, REPORTS = "444455556666", "777788889999"  # examples/spill/fleet.yaml's consumer accounts
CHECKOUT_VPCE, REPORTS_VPCE = "vpce-0aaaaaaaaaaaaaaa1", "vpce-0bbbbbbbbbbbbbbb2"
FAILOVER_VPCE = "vpce-0eeeeeeeeeeeeeee5"  # checkout's own (failover) endpoint to us-west-2
MODEL = "gpt2-xl"


def spill_config(tmp: Path) -> Path:
    """examples/spill/fleet.yaml with one request per engine at a time: the home engine is full with one stream."""
    from fleetcast.config import parse_config

    data = yaml.safe_load((ROOT / "examples" / "spill" / "fleet.yaml").read_text())
    data["engine"]["max_batch_size"] = 1
    for region in data["regions"]:
        region["pools"][0]["scaling"] = {"target": 1}
    path = tmp / "fleet.json"
    path.write_text(parse_config(data, "<spill test>").model_dump_json())
    return path


async def engine(token_delay_s: float) -> Proc:
    proc = Proc(await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.engine_process", str(token_delay_s), cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.PIPE))
    await asyncio.wait_for(proc.first, 30)
    return proc


async def gateway(config: Path, region: str, engine_port: int, endpoints: list[tuple[str, str]], key_file: Path,
                  *extra: str) -> tuple[Proc, int, FakeEc2Endpoints]:
    ec2 = FakeEc2Endpoints(endpoints)
    port = free_port()
    env = {**os.environ, "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{await ec2.start()}", "AWS_MAX_ATTEMPTS": "1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "PYTHONPATH": str(ROOT)}
    env.pop("FLEETCAST_CONFIG_PARAM", None)
    proc = Proc(await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}", "--upstream",
        f"127.0.0.1:{engine_port}", "--config-json", str(config), "--region", region, "--pool", "l40s",
        "--peer-key-file", str(key_file), "--upstream-warm", "0", *extra,
        cwd=str(ROOT), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL))
    for _ in range(300):  # up to 30 s to start (imports, the first EC2 read), on a loaded machine
        try:
            reply = await Client(port, vpce_id=None).request("GET", "/health")
            if reply.status == 200:
                return proc, port, ec2
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"the {region} gateway did not become healthy")


class Fleet:
    """Both regions' processes and the path between them."""

    async def start(self, tmp: Path) -> Fleet:
        config, key_file = spill_config(tmp), tmp / "peer.key"
        key_file.write_bytes(KEY)
        self.waiting: list[asyncio.Task[Any]] = []  # requests kept home by until_spilled
        self.home_engine = await engine(0.05)  # a 40-token stream holds the home engine about 2 s
        self.remote_engine = await engine(0.0)
        self.remote, self.remote_port, self.remote_ec2 = await gateway(
            config, "us-west-2", int(self.remote_engine.first.result()),
            [(SPILL_VPCE, PROVIDER), (FAILOVER_VPCE, CHECKOUT)], key_file)
        self.path = DelayingProxy(self.remote_port)
        path_port = await self.path.start()
        self.queue_state = tmp / "home-queue.json"
        self.home, self.home_port, self.home_ec2 = await gateway(
            config, "us-east-1", int(self.home_engine.first.result()),
            [(CHECKOUT_VPCE, CHECKOUT), (REPORTS_VPCE, REPORTS), (SPILL_VPCE, PROVIDER)], key_file,
            "--spill-endpoint", f"us-west-2=127.0.0.1:{path_port}", "--breaker-cool-s", str(BREAKER_COOL_S),
            "--queue-state", str(self.queue_state))
        for _ in range(300):  # the home has read the remote's headroom once (a read measured the round trip)
            if (await self.link())["rtt_ms"] is not None:
                return self
            await asyncio.sleep(0.05)
        raise AssertionError("the home gateway never read the remote's headroom")

    async def link(self) -> dict[str, Any]:
        """The home gateway's link to us-west-2 (breaker state, round trip), from its headroom answer (to a
        gateway's connection)."""
        reply = await Client(self.home_port, SPILL_VPCE).request("GET", HEADROOM_PATH)
        return dict(reply.json()["links"]["us-west-2"])

    async def breaker(self) -> str:
        return str((await self.link())["breaker"])

    async def until_queued_home(self, n: int) -> None:
        """Until `n` requests wait in the home gateway's fair-admission queues (its --queue-state file, rewritten
        every second): their spill decisions are made, they were kept home."""
        for _ in range(300):
            if read_queue_state(self.queue_state) == n:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"never {n} requests waiting at home (last: {read_queue_state(self.queue_state)})")

    async def until_breaker(self, state: str) -> None:
        for _ in range(600):
            if await self.breaker() == state:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the breaker never became {state}")

    async def stop(self) -> None:
        for waiting in self.waiting:
            waiting.cancel()
        # Together: each stop waits for its process to exit (the gateways write their last records as they do).
        await asyncio.gather(self.home.stop(), self.remote.stop())
        await asyncio.gather(self.home_engine.stop(), self.remote_engine.stop())
        self.path.close()

    async def occupy_home(self, tokens: int = 40) -> tuple[Client, asyncio.Task[Any]]:
        """A `reports` stream (strict residency) holding the home engine's one slot; returns once it started."""
        client = await Client(self.home_port, REPORTS_VPCE).connect()
        await client.send("POST", "/v1/completions", {"model": MODEL, "prompt": "hold", "max_tokens": tokens,
                                                      "stream": True})
        status, head = await asyncio.wait_for(client.read_head(), 30)
        assert status == 200
        return client, asyncio.ensure_future(client.read_body(head))

    async def until_spilled(self, body: dict[str, Any], vpce: str = CHECKOUT_VPCE, tries: int = 60):
        """Send `body` as checkout, one request at a time, until one was served by the remote region (the headroom
        answer arrives within a second of the home gateway's start); the replies that came, the spilled one last.
        A request the home keeps waits behind its full engine: it is left waiting (cancelled at stop) and the next
        one goes, so one request kept home (a headroom answer late on a loaded machine) does not use up the time
        the home stays full."""
        replies = []
        for _ in range(tries):
            before = len(self.remote.records())
            sent = asyncio.ensure_future(Client(self.home_port, vpce).request("POST", "/v1/completions", body))
            done, _ = await asyncio.wait({sent}, timeout=SPILLED_REPLY_S)
            if not done:
                self.waiting.append(sent)
                continue
            replies.append(sent.result())
            await asyncio.sleep(0.3)  # the remote's record is written within its flush period (0.2 s)
            if any(r.get("origin_region") == "us-east-1" for r in self.remote.records()[before:]):
                return replies
        raise AssertionError(f"no request spilled in {tries} tries")


# A spilled request's reply comes from the idle remote engine in well under a second; one that takes longer is
# waiting at home.
SPILLED_REPLY_S = 5.0
# The home's breaker cool-down (the product's default is 5 s): the requests sent once it opened are decided within
# a fraction of a second, many times less than this; it is also how long the test waits for the half-open probe.
BREAKER_COOL_S = 4.0


def run(coro: Any, timeout: float = 240.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_a_saturated_home_spills_a_stream_intact_and_each_request_is_metered_once_where_it_ran(tmp_path):
    async def body() -> None:
        fleet = await Fleet().start(tmp_path)
        try:
            holder, held = await fleet.occupy_home(tokens=200)  # 10 s: the home engine stays full meanwhile
            stream = {"model": MODEL, "prompt": "one two three", "max_tokens": 12, "stream": True}
            replies = await fleet.until_spilled(stream)
            spilled = replies[-1]
            assert spilled.status == 200
            # Intact: every token in order, the stream's end, and no usage event the caller did not ask for
            # (the remote gateway asked its engine for usage and stripped it; the home passed bytes through).
            assert spilled.text == completion_text(12)
            assert spilled.events[-1] == "[DONE]"
            assert not any(isinstance(e, dict) and e.get("usage") for e in spilled.events)
            assert all(e.get("model") == MODEL for e in spilled.events if isinstance(e, dict))

            # Strict residency: `reports` (no spill_regions) waits at home however full it is: it is decided while
            # the holder fills the home engine, and served once that stream ends.
            strict = asyncio.ensure_future(Client(fleet.home_port, REPORTS_VPCE).request(
                "POST", "/v1/completions", {"model": MODEL, "prompt": "stay", "max_tokens": 2}))
            await fleet.until_queued_home(len(fleet.waiting) + 1)
            holder.writer.close()
            held.cancel()
            assert (await asyncio.wait_for(strict, 60)).status == 200

            # The headroom answer is for gateways: a consumer's connection gets the unknown route.
            probe = await Client(fleet.home_port, CHECKOUT_VPCE).request("GET", HEADROOM_PATH)
            assert probe.status == 404 and probe.json()["error"]["code"] == "unknown_url"
        finally:
            await fleet.stop()
        home, remote = fleet.home.records(), fleet.remote.records()
        served = [r for r in home + remote if r.get("Requests") == 1 and r.get("Consumer") == "checkout"]
        assert len(served) == len(replies) and all(r["status"] == 200 for r in served)
        assert not any(r.get("Consumer") == "reports" for r in remote)
        spilled_home = [r for r in home if r.get("SpilledRequests") == 1]
        spilled_remote = [r for r in remote if r.get("origin_region") == "us-east-1"]
        assert len(spilled_home) == len(spilled_remote) >= 1
        assert all("Requests" not in r and "OutputTokens" not in r for r in spilled_home)
        assert all(r["serving_region"] == "us-west-2" and r["Consumer"] == "checkout" for r in spilled_home)
        assert all(r["serving_region"] == "us-west-2" and r["Requests"] == 1 for r in spilled_remote)
        assert spilled_remote[-1]["OutputTokens"] == 12 and spilled_remote[-1]["InputTokens"] == 3
        local = [r for r in home if r.get("Requests") == 1]
        assert all(r["origin_region"] == r["serving_region"] == "us-east-1" for r in local)

    run(body())


def test_the_remote_gateway_accepts_a_forwarded_identity_only_from_the_spill_endpoint_signed_fresh_and_once(tmp_path):
    async def body() -> None:
        fleet = await Fleet().start(tmp_path)
        try:
            request = {"model": MODEL, "prompt": "a b", "max_tokens": 3}
            raw = json.dumps(request).encode()

            def claim(key: bytes = KEY, **kw: Any) -> dict[str, str]:
                fields = {"consumer": "checkout", "model": MODEL, "origin": "us-east-1", "destination": "us-west-2"}
                return {PEER_HEADER: sign(key, body=raw, **{**fields, **kw})}

            async def via_path(headers: dict[str, str]) -> Any:
                return await Client(fleet.remote_port, SPILL_VPCE).request("POST", "/v1/completions", request,
                                                                           headers)

            # A consumer's own endpoint carrying a perfectly signed claim: refused, it is not a gateway.
            direct = await Client(fleet.remote_port, FAILOVER_VPCE).request("POST", "/v1/completions", request,
                                                                            claim())
            assert direct.status == 403 and direct.json()["error"]["code"] == "peer_identity_refused"
            assert (await via_path(claim(key=b"x" * 48))).status == 403  # another key
            assert (await via_path(claim(destination="eu-west-1"))).status == 403  # for another region
            assert (await via_path(claim(hop=2))).status == 403  # a second hop
            assert (await via_path(claim(consumer="reports"))).json()["error"]["code"] == "residency"
            good = claim()
            assert (await via_path(good)).status == 200
            replay = await via_path(good)
            assert replay.status == 403 and "replay" in replay.json()["error"]["message"]
            tampered = await Client(fleet.remote_port, SPILL_VPCE).request(
                "POST", "/v1/completions", {**request, "max_tokens": 200}, claim())
            assert tampered.status == 403 and "another body" in tampered.json()["error"]["message"]
        finally:
            await fleet.stop()
        remote = fleet.remote.records()
        assert sum(r.get("Requests", 0) for r in remote) == 1  # only the one good claim was served and metered
        assert sum(r.get("UnknownEndpointRequests", 0) for r in remote) == 7

    run(body())


def test_the_breaker_opens_on_a_failing_path_keeps_traffic_home_then_a_probe_brings_spill_back(tmp_path):
    async def body() -> None:
        fleet = await Fleet().start(tmp_path)
        try:
            holder, held = await fleet.occupy_home(tokens=1200)  # 60 s of a full home engine
            small = {"model": MODEL, "prompt": "x", "max_tokens": 2}
            await fleet.until_spilled(small)  # the link works and the home spills
            fleet.path.fail_posts()
            # Requests keep coming; each one the policy sends fails before a byte and is served at home instead
            # (its client never sees the failure). One headroom answer is spent on one request (remote cap 1), so
            # the failures come about one per headroom read until the breaker opens.
            tries = []
            for _ in range(60):
                tries.append(asyncio.ensure_future(Client(fleet.home_port, CHECKOUT_VPCE).request(
                    "POST", "/v1/completions", small)))
                await asyncio.sleep(0.3)
                if await fleet.breaker() == "open":
                    break
            assert await fleet.breaker() == "open"
            # Open: the next requests stay home without touching the path (for the cool-down, BREAKER_COOL_S).
            posts = fleet.path.posts
            later = [asyncio.ensure_future(Client(fleet.home_port, CHECKOUT_VPCE).request(
                "POST", "/v1/completions", small)) for _ in range(2)]
            holder.writer.close()
            held.cancel()  # the home engine frees: the requests that fell back are served here
            replies = await asyncio.wait_for(asyncio.gather(*tries, *later), 120)
            assert [r.status for r in replies] == [200] * (len(tries) + 2)
            assert fleet.path.posts == posts
            assert all(r.json()["choices"][0]["text"] == completion_text(2) for r in replies)
            # Heal the path; after the cool-down a half-open probe succeeds and spilling resumes.
            fleet.path.drop_posts = False
            await fleet.until_breaker("half_open")
            holder, held = await fleet.occupy_home(tokens=1200)
            await fleet.until_spilled(small)  # bounded by tries, not by time: under load a headroom read may lag
            assert await fleet.breaker() == "closed"
            holder.writer.close()
            held.cancel()
        finally:
            await fleet.stop()
        failed = [r for r in fleet.home.records() if "spill_failed" in r]
        assert len(failed) >= 3 and all(r["spill_failed"]["region"] == "us-west-2" for r in failed)

    run(body())


def test_a_gateway_without_the_peer_key_refuses_claims_then_accepts_them_once_the_key_arrives(tmp_path):
    """The key's replica may reach a region after its instances start (docs/stacks.md, "Peer key"): the gateway
    serves its own consumers meanwhile, refuses forwarded identity, and reads the key again every refresh period."""
    async def body() -> None:
        config, key_file = spill_config(tmp_path), tmp_path / "late.key"
        remote_engine = await engine(0.0)
        remote, port, _ = await gateway(config, "us-west-2", int(remote_engine.first.result()),
                                        [(SPILL_VPCE, PROVIDER)], key_file, "--refresh-s", "0.5")
        try:
            request = {"model": MODEL, "prompt": "a b", "max_tokens": 3}
            raw = json.dumps(request).encode()

            async def forwarded() -> Any:
                header = sign(KEY, consumer="checkout", model=MODEL, origin="us-east-1", destination="us-west-2",
                              body=raw)
                return await Client(port, SPILL_VPCE).request("POST", "/v1/completions", request,
                                                              {PEER_HEADER: header})

            refused = await forwarded()
            assert refused.status == 403 and refused.json()["error"]["code"] == "peer_identity_refused"
            key_file.write_bytes(KEY)
            for _ in range(100):
                reply = await forwarded()
                if reply.status == 200:
                    break
                await asyncio.sleep(0.2)
            assert reply.status == 200 and reply.json()["choices"][0]["text"] == completion_text(3)
        finally:
            await remote.stop()
            await remote_engine.stop()

    run(body())
