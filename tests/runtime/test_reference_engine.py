"""runtime.reference model and engine: the cached, batched decode computes what a naive forward does."""

from __future__ import annotations

import threading

import pytest

from runtime.reference.build import random_weights
from runtime.reference.configs import shape_for
from runtime.reference.tokenizer import EOS_ID, VOCAB_SIZE
from tests.optional import needs_torch

SHAPE = shape_for("tiny")

# One worker runs both in-process engine modules, so one imports PyTorch (tests/test_conftest.py).
pytestmark = [needs_torch, pytest.mark.xdist_group("torch-in-process")]


@pytest.fixture(scope="module", autouse=True)
def _engine_modules():
    """PyTorch, the model and the engine, imported when this module's tests run rather than when it is collected:
    every xdist worker collects every module, and each paid 3 s of CPU for PyTorch there (tests/optional.py)."""
    global torch, Engine, SamplingParams, Sequence, GPT2, naive_logits
    import torch

    from runtime.reference.engine import Engine, SamplingParams, Sequence
    from runtime.reference.model import GPT2, naive_logits


@pytest.fixture(scope="module")
def weights():
    return random_weights(SHAPE, seed=11)


def naive_greedy(weights, prompt: list[int], n: int) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        out.append(int(naive_logits(SHAPE, weights, ids)[-1, :VOCAB_SIZE].argmax()))
        ids.append(out[-1])
    return out


PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [100, 200, 50, 60, 70, 80, 90, 10, 11], [42]]


@pytest.mark.parametrize("attention", ["sdpa", "bmm"])
def test_batched_cached_decode_matches_naive_recompute(weights, attention):
    model = GPT2(SHAPE, weights)
    model.decode_attention = attention
    cache = model.new_cache(len(PROMPTS), SHAPE.n_positions)
    last, pos = [], []
    for slot, prompt in enumerate(PROMPTS):
        last.append(int(model.prefill(cache, slot, torch.tensor(prompt))[:VOCAB_SIZE].argmax()))
        pos.append(len(prompt))
    got = [[t] for t in last]
    for _ in range(11):
        logits = model.decode(cache, torch.tensor(last), torch.tensor(pos), max(pos) + 1)
        last = [int(t) for t in logits[:, :VOCAB_SIZE].argmax(-1)]
        pos = [p + 1 for p in pos]
        for out, t in zip(got, last):
            out.append(t)
    want = [naive_greedy(weights, p, 12) for p in PROMPTS]
    assert got == want
    assert len({tuple(w) for w in want}) == len(want) and any(len(set(w)) > 3 for w in want)  # not a constant model


def test_decode_logits_agree_with_naive_logits_numerically(weights):
    model = GPT2(SHAPE, weights)
    cache = model.new_cache(1, 64)
    prompt = [5, 6, 7, 8]
    model.prefill(cache, 0, torch.tensor(prompt))
    step = model.decode(cache, torch.tensor([9]), torch.tensor([4]), 5)[0]
    ref = naive_logits(SHAPE, weights, prompt + [9])[-1]
    assert float((step - ref).norm() / ref.norm()) < 1e-5


def run_engine(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> list[tuple[list[int], str]]:
    done = [threading.Event() for _ in requests]
    results: list[tuple[list[int], str | None]] = [([], None) for _ in requests]

    def emitter(i):
        def emit(token, reason):
            if token is not None:
                results[i][0].append(token)
            if reason is not None:
                results[i] = (results[i][0], reason)
                done[i].set()
        return emit

    for i, (prompt, params) in enumerate(requests):
        engine.submit(Sequence(prompt=prompt, params=params, emit=emitter(i)))
    for ev in done:
        assert ev.wait(60), "a request did not finish"
    return results


def test_engine_batches_more_requests_than_slots_and_each_gets_its_naive_tokens(weights):
    """Different lengths finish at different iterations, so slots are compacted mid-flight."""
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=3, max_seq_len=SHAPE.n_positions,
                    vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    engine.start()
    try:
        lengths = [3, 9, 1, 6, 12, 4, 7]
        prompts = [PROMPTS[i % len(PROMPTS)] + [i] for i in range(len(lengths))]
        requests = [(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)) for p, n in zip(prompts, lengths)]
        results = run_engine(engine, requests)
    finally:
        engine.stop()
    for (prompt, params), (tokens, reason) in zip(requests, results):
        assert reason == "length"
        assert tokens == naive_greedy(weights, prompt, params.max_tokens)
    stats = engine.pop_stats()
    assert max(s["numActiveRequests"] for s in stats) == 3
    assert max(s["numQueuedRequests"] for s in stats) > 0
    assert sum(s["numCompletedRequests"] for s in stats) == len(requests)
    assert engine.pop_stats() == []


def test_a_request_admitted_into_a_cancelled_requests_slot_starts_in_the_next_iteration(weights):
    """The gateway frees a slot when a client leaves (runtime/gateway/fair.py) and may admit the next request into
    it at once: the engine retires the cancelled sequence before it fills the batch, so the new one starts in the
    very next iteration instead of waiting one behind a batch that only looks full."""
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=1, max_seq_len=SHAPE.n_positions,
                    vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    finished = threading.Event()
    reasons: dict[str, str] = {}

    def second_emit(token, reason):
        if reason is not None:
            reasons["second"] = reason
            finished.set()

    second = Sequence(prompt=[5, 6, 7], params=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
                      emit=second_emit)

    def first_emit(token, reason):
        if reason is not None:
            reasons["first"] = reason
        elif not first.cancelled and token is not None and first.generated >= 2:
            # Inside an iteration (the engine thread delivers tokens): the client leaves and, as the gateway
            # would, the next request goes in at once; the next iteration sees both.
            engine.cancel(first)
            engine.submit(second)

    first = Sequence(prompt=[1, 2, 3], params=SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True),
                     emit=first_emit)
    engine.start()
    try:
        engine.submit(first)
        assert finished.wait(60), "the second request did not finish"
    finally:
        engine.stop()
    assert reasons == {"first": "cancelled", "second": "length"}
    stats = engine.pop_stats()
    (admitted_at,) = [i for i, s in enumerate(stats) if s["numNewActiveRequests"] and i > 0]
    # The iteration that retires the cancelled request admits the waiting one; it never queued a whole iteration.
    assert stats[admitted_at]["numCompletedRequests"] >= 1 and stats[admitted_at]["numQueuedRequests"] == 0
    assert all(s["numQueuedRequests"] == 0 for s in stats)


def test_eos_is_suppressed_before_min_tokens_and_with_ignore_eos(weights):
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=1, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    logits = torch.zeros(SHAPE.vocab_size)
    top2 = (EOS_ID, 65)

    def seq(**kw):
        return Sequence(prompt=[1], params=SamplingParams(temperature=0.0, max_tokens=10, **kw), emit=lambda *a: None)

    def choose(seq, row, top2):
        return engine._choose_rows([seq], row.unsqueeze(0), [top2])[0]

    assert choose(seq(), logits, top2) == EOS_ID
    assert choose(seq(ignore_eos=True), logits, top2) == 65
    early = seq(min_tokens=3)
    assert choose(early, logits, top2) == 65
    early.generated = 3
    assert choose(early, logits, top2) == EOS_ID
    sampled = seq(ignore_eos=True)
    sampled.params.temperature = 1.0
    peaked = torch.full((SHAPE.vocab_size,), -30.0)
    peaked[EOS_ID] = 30.0
    peaked[70] = 0.0
    assert choose(sampled, peaked, (EOS_ID, 70)) == 70  # sampling never draws a suppressed EOS


def test_eos_ends_a_sequence_with_finish_reason_stop(weights):
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=1, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    events = []
    s = Sequence(prompt=[1], params=SamplingParams(max_tokens=10), emit=lambda t, r: events.append((t, r)))
    assert engine._deliver(s, 5) is False
    assert engine._deliver(s, EOS_ID) is True
    assert events == []  # queued until the delivery point
    engine._flush()
    assert events == [(5, None), (EOS_ID, "stop")]


def test_requests_that_cannot_fit_are_refused_naming_the_field(weights):
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=1, max_seq_len=32, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    with pytest.raises(ValueError, match="^max_tokens: .*exceeds the max sequence length 32"):
        engine.validate([1] * 20, SamplingParams(max_tokens=13))
    with pytest.raises(ValueError, match="^prompt: token id 512"):
        engine.validate([1, 512], SamplingParams())
    with pytest.raises(ValueError, match="^prompt:"):
        engine.validate([], SamplingParams())
    with pytest.raises(ValueError, match="^max_seq_len:"):
        Engine(GPT2(SHAPE, weights), max_batch_size=1, max_seq_len=SHAPE.n_positions + 1,
               vocab_size=VOCAB_SIZE, eos_id=EOS_ID)


def test_seeded_sampling_is_reproducible(weights):
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=2, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    engine.start()
    try:
        params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
        a, b = run_engine(engine, [([3, 4], params), ([3, 4], params)])
    finally:
        engine.stop()
    assert a[0] == b[0] and len(a[0]) == 12


def test_an_engine_failure_ends_every_request_with_error_and_is_reported(weights):
    model = GPT2(SHAPE, weights)
    engine = Engine(model, max_batch_size=2, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)

    def broken_decode(*args, **kwargs):
        raise RuntimeError("simulated device fault")

    model.decode = broken_decode
    engine.start()
    try:
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        results = run_engine(engine, [([1, 2], params), ([3], params), ([4], params)])
    finally:
        engine.stop()
    assert [reason for _, reason in results] == ["error", "error", "error"]
    assert isinstance(engine.failed, RuntimeError)
    with pytest.raises(RuntimeError, match="stopped"):
        engine.submit(Sequence(prompt=[1], params=params, emit=lambda *a: None))


def choose_one_row_at_a_time(engine, seq, logits_row, top2):
    """The engine's sampling before it chose a step's rows together (one torch.multinomial per row): the
    specification the batched choice must reproduce token for token."""
    p = seq.params
    suppress = p.ignore_eos or seq.generated < p.min_tokens
    if p.temperature <= 0:
        first, second = top2
        return second if first == engine.eos_id and suppress else first
    scores = logits_row[: engine.vocab_size].float() / p.temperature
    if suppress:
        scores[engine.eos_id] = float("-inf")
    if p.top_k > 0 and p.top_k < scores.numel():
        kth = torch.topk(scores, p.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = scores.softmax(-1)
    if p.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > p.top_p
        probs = probs.scatter(0, order, sorted_p.masked_fill(drop, 0.0))
    if seq.generator is None:
        seq.generator = torch.Generator(device=probs.device)
        seq.generator.manual_seed(p.seed)
    return int(torch.multinomial(probs, 1, generator=seq.generator))


def test_a_steps_rows_chosen_together_are_the_tokens_one_multinomial_per_row_gives(weights):
    """aten's multinomial draws one sample as argmax(probs / Exp(1) noise) (aten/src/ATen/native/Distributions.cpp);
    the batched choice draws the same noise from each seeded request's own generator, so a seed keeps its tokens
    whatever else shares the step. Greedy and sampled rows mixed, every sampling option, 40 steps of 12 rows."""
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=12, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    options = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=20),
               dict(temperature=1.3, top_p=0.8), dict(temperature=0.9, top_k=40, top_p=0.95),
               dict(temperature=1.0, min_tokens=30), dict(temperature=0.5, ignore_eos=True), dict(temperature=2.0),
               dict(temperature=0.0, ignore_eos=True), dict(temperature=1.0, top_p=0.5),
               dict(temperature=0.8, top_k=3), dict(temperature=1.0, top_k=600)]

    def requests():
        return [Sequence(prompt=[1], params=SamplingParams(max_tokens=64, seed=100 + i, **kw))
                for i, kw in enumerate(options)]

    batched, one_by_one = requests(), requests()
    noise = torch.Generator().manual_seed(5)
    drawn = set()
    for step in range(40):
        logits = torch.randn(len(options), SHAPE.vocab_size, generator=noise) * 4
        logits[:, EOS_ID] += 6.0 * (step % 3 == 0)  # EOS often on top, so its suppression matters
        tops = torch.topk(logits[:, :VOCAB_SIZE], 2, dim=-1).indices.tolist()
        got = engine._choose_rows(batched, logits, tops)
        want = [choose_one_row_at_a_time(engine, seq, logits[i], tops[i]) for i, seq in enumerate(one_by_one)]
        assert got == want, f"step {step}"
        for a, b in zip(batched, one_by_one):
            a.generated = b.generated = step + 1
        drawn.update(got)
    assert len(drawn) > 50  # the rows really were sampled


def test_a_seeded_request_gives_the_same_tokens_alone_and_beside_others(weights):
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=4, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    engine.start()
    try:
        seeded = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=77, ignore_eos=True)
        (alone, _), = run_engine(engine, [([5, 6], seeded)])
        unseeded = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
        greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
        results = run_engine(engine, [([9], unseeded), ([5, 6], seeded), ([7, 7, 7], greedy), ([5, 6], seeded)])
    finally:
        engine.stop()
    assert results[1][0] == alone and results[3][0] == alone
    assert results[2][0] == naive_greedy(weights, [7, 7, 7], 20)


def test_each_delivery_point_hands_all_its_sequences_tokens_over_in_one_call(weights):
    """One call per delivery point (the prefill's first tokens, then each decode step), not one per sequence: the
    server turns each call into one wake-up of its event loop."""
    calls: list[list[tuple[int, int | None, str | None]]] = []
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=4, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID,
                    deliver=lambda events: calls.append([(seq.id, token, reason) for seq, token, reason in events]))
    seqs = [Sequence(prompt=[i + 1, 2], params=SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
            for i in range(4)]
    for seq in seqs:
        engine._waiting.append(seq)  # all four waiting when the engine starts: one prefill, then steps of four
    engine.start()
    try:
        deadline = threading.Event()
        for _ in range(200):
            if sum(len(c) for c in calls) == 20:
                break
            deadline.wait(0.05)
    finally:
        engine.stop()
    assert [len(c) for c in calls] == [4] * 5
    assert [{reason for _, _, reason in c} for c in calls] == [{None}] * 4 + [{"length"}]
    assert all({sid for sid, _, _ in c} == {s.id for s in seqs} for c in calls)


def test_requests_without_a_seed_share_a_generator_but_not_their_draws(weights):
    """Unseeded rows draw from one generator in one op: each row its own noise, so identical requests in one step
    still get their own tokens, and a suppressed EOS is never drawn."""
    engine = Engine(GPT2(SHAPE, weights), max_batch_size=8, max_seq_len=64, vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    seqs = [Sequence(prompt=[1], params=SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True))
            for _ in range(8)]
    logits = torch.zeros(8, SHAPE.vocab_size)
    logits[:, EOS_ID] = 3.0  # EOS the likeliest token, and suppressed
    tops = torch.topk(logits[:, :VOCAB_SIZE], 2, dim=-1).indices.tolist()
    draws = [engine._choose_rows(seqs, logits, tops) for _ in range(5)]
    assert all(len(set(step)) > 4 for step in draws)  # 8 rows over 256 equally likely tokens
    assert EOS_ID not in {t for step in draws for t in step}
    assert engine._rng is not None and all(s.generator is None for s in seqs)
