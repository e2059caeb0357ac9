"""Routing: the /metrics parser, scores, staleness, affinity (sessions, prefix index), the guard.

The router is driven directly with an injected clock and a recorded scrape state;
the scraper's reads go through a fake endpoint action (the edge to a node). The
scraper against real engines is in tests/gateway/test_routing_e2e.py.
"""

from __future__ import annotations

import json
import random

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from ficc_core.base.errors import FiccError
from ficc_core.controller.metrics import Metrics
from ficc_core.executor.types import BodyChunk, EndOfStream, ResponseHead
from ficc_core.gateway.affinity import BLOCK, PIECE, Affinity, imbalanced, prompt_of
from ficc_core.gateway.scoring import Router
from ficc_core.gateway.scrape import EngineLoad, ReplicaLoad, Scraper, parse_load
from ficc_core.routing.live import LiveReplica, LiveService, LiveTable
from ficc_core.testing.executor_kit import new_fence

from ..support.clock import FakeClock
from ..support.gateway_support import routing_request

#: vLLM 0.10's exposition (names, labels and layout as it serves them), trimmed.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} NaN
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.61
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 17.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 17.0
"""
#: Before vLLM 0.10 the KV gauge was gpu_cache_usage_perc.
VLLM_OLD_TEXT = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.95
"""


def _view(count: int = 2, concurrency: int = 4, service_id: str = "svc") -> LiveService:
    return LiveService(
        id=service_id,
        project_id="p",
        alias="chat",
        generation=1,
        admission="serving",
        concurrency=concurrency,
        replicas=tuple(LiveReplica(index=i, node_id="n", fence=new_fence(1)) for i in range(count)),
    )


@attrs.define
class Setup:
    router: Router
    scraper: Scraper
    affinity: Affinity
    clock: FakeClock
    local: dict[str, int]

    def scraped(self, replica: LiveReplica, running: float, waiting: float = 0.0, **kw) -> None:
        """Record a good scrape of ``replica`` now, with the gateway's count at that moment."""
        known = self.scraper.replicas.setdefault(
            replica.key, ReplicaLoad("svc", first_seen=self.clock.now)
        )
        known.load = EngineLoad(running=running, waiting=waiting, kv=kw.get("kv"))
        known.at = self.clock.now
        known.local_at = self.local.get(replica.key, 0)

    def pick(self, view: LiveService, tried=(), **request) -> LiveReplica | None:
        return self.router.pick(view, set(tried), routing_request(view, **request))


def _setup(seed: int = 1, **options) -> Setup:
    clock = FakeClock()
    local: dict[str, int] = {}
    metrics = Metrics()
    scraper = Scraper(
        LiveTable(),
        None,  # type: ignore[arg-type]  # no reads here
        lambda key: local.get(key, 0),
        metrics,
        interval=1.0,
        timeout=1.0,
        clock=clock,
    )
    affinity = Affinity(
        session_header="x-session-id",
        session_ttl=options.pop("session_ttl", 600.0),
        session_max_entries=options.pop("session_max_entries", 1000),
        prefix_enabled=options.pop("prefix_enabled", True),
        prefix_max_entries=options.pop("prefix_max_entries", 10_000),
        prefix_min_match=options.pop("prefix_min_match", 1024),
        prefix_ttl=options.pop("prefix_ttl", 300.0),
        prefix_match_ratio=options.pop("prefix_match_ratio", 0.5),
        clock=clock,
    )
    router = Router(
        local=lambda key: local.get(key, 0),
        scraper=scraper,
        affinity=affinity,
        metrics=metrics,
        rng=random.Random(seed),
        target_inflight=options.pop("target_inflight", 8.0),
        target_waiting=options.pop("target_waiting", 2.0),
        kv_ceiling=options.pop("kv_ceiling", 0.9),
        stale_after=options.pop("stale_after", 5.0),
        session_load_factor=options.pop("session_load_factor", 0.0),
        balance_abs=options.pop("balance_abs", 4.0),
        balance_rel=options.pop("balance_rel", 1.5),
        clock=clock,
    )
    assert not options
    return Setup(router, scraper, affinity, clock, local)


def _chat(*contents: str, **extra) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                for i, c in enumerate(contents)]  # fmt: skip
    return json.dumps({"model": "chat", "messages": messages, **extra}).encode()


# -- the parser ------------------------------------------------------------------------------


def test_vllm_figures_are_summed_over_engines_and_kv_is_the_fullest():
    assert parse_load(VLLM_TEXT) == EngineLoad(running=5.0, waiting=4.0, kv=0.61)


def test_the_pre_0_10_vllm_kv_gauge_is_read():
    assert parse_load(VLLM_OLD_TEXT) == EngineLoad(running=1.0, waiting=0.0, kv=0.95)


def test_the_parser_is_tolerant_of_what_expositions_hold():
    text = (
        "# a comment\n\n"
        'llamacpp:requests_processing{slot="a b}c",x="\\"q\\""} 2 1700000000000\n'
        "llamacpp:requests_deferred +Inf\n"
        "llamacpp:requests_deferred garbage\n"
        "llamacpp:requests_processing{broken 7\n"
        "lonely_name_without_value\n"
    )
    assert parse_load(text) == EngineLoad(running=2.0, waiting=float("inf"), kv=None)


@given(st.text())
def test_the_parser_never_fails_on_any_text(text):
    load = parse_load("llamacpp:requests_processing 1\n" + text)
    assert load is not None
    assert load.kv is None or 0 <= load.kv <= 1


def test_an_exposition_without_load_figures_gives_none():
    assert parse_load("standin_requests 12\n# EOF\n") is None
    assert parse_load("") is None


def test_the_parser_is_cheaper_than_prometheus_clients():
    # Scraping is off the request path but runs for every replica every interval.
    import timeit

    from prometheus_client.parser import text_string_to_metric_families

    text = VLLM_TEXT * 40  # a vLLM-sized body (~30 KiB)
    ours = timeit.timeit(lambda: parse_load(text), number=200)
    theirs = timeit.timeit(lambda: list(text_string_to_metric_families(text)), number=200)
    assert ours < theirs


# -- scores ----------------------------------------------------------------------------------


def test_the_lowest_score_wins_from_scraped_waiting_and_running():
    s = _setup()
    view = _view(3)
    a, b, c = view.replicas
    s.scraped(a, running=4, waiting=2)
    s.scraped(b, running=1)
    s.scraped(c, running=2)
    assert s.pick(view) == b


def test_requests_sent_since_the_scrape_are_added_to_the_scraped_figures():
    s = _setup()
    view = _view(2)
    a, b = view.replicas
    s.scraped(a, running=0)
    s.scraped(b, running=1)
    s.local[a.key] = 3  # three sent to a since its scrape, none to b
    assert s.pick(view) == b
    assert s.router.rate(a.key, 3, s.clock.now)[2] == 3.0
    s.local[a.key] = 0  # they ended: back to the scraped figure, never below zero
    assert s.router.rate(a.key, 0, s.clock.now)[2] == 0.0


def test_a_replica_over_the_kv_ceiling_is_avoided_while_another_is_under_it():
    s = _setup()
    view = _view(2)
    a, b = view.replicas
    s.scraped(a, running=0, kv=0.95)
    s.scraped(b, running=6, kv=0.5)
    assert s.pick(view) == b
    s.scraped(b, running=6, kv=0.92)  # both over: the score decides again
    assert s.pick(view) == a


def test_a_stale_replica_is_scored_down_and_its_old_figures_not_trusted():
    s = _setup(stale_after=5.0)
    view = _view(2)
    a, b = view.replicas
    s.scraped(a, running=0)
    s.scraped(b, running=3)
    s.clock.now += 4
    s.scraped(b, running=3)  # b keeps answering; a's last good read ages
    assert s.pick(view) == a
    s.clock.now += 2  # a's read is now 6 s old
    assert s.router.rate(a.key, 0, s.clock.now)[0] == 1
    assert s.pick(view) == b
    s.scraped(a, running=0)  # a answers again
    assert s.pick(view) == a


def test_a_replica_just_joined_is_not_stale_before_its_first_read():
    s = _setup(stale_after=5.0)
    view = _view(1)
    [a] = view.replicas
    s.scraper.replicas[a.key] = ReplicaLoad("svc", first_seen=s.clock.now)
    assert s.router.rate(a.key, 0, s.clock.now)[0] == 0
    s.clock.now += 6
    assert s.router.rate(a.key, 0, s.clock.now)[0] == 1


def test_an_engine_without_metrics_is_scored_by_the_gateways_in_flight_alone():
    s = _setup(stale_after=5.0)
    view = _view(2)
    a, b = view.replicas
    for replica in (a, b):
        s.scraper.replicas[replica.key] = ReplicaLoad("svc", s.clock.now, unscraped=True)
    s.clock.now += 60  # never stale: there is nothing to read
    s.local[a.key] = 2
    s.local[b.key] = 1
    assert s.pick(view) == b
    assert s.router.rate(b.key, 1, s.clock.now)[:2] == (0, 1 / 8)


def test_tried_replicas_and_full_ones_are_never_picked():
    s = _setup()
    view = _view(3, concurrency=2)
    a, b, c = view.replicas
    for replica in (a, b, c):
        s.scraped(replica, running=0)
    s.local[b.key] = 2
    s.scraped(c, running=0)
    s.local[c.key] = 0
    for _ in range(20):
        assert s.pick(view, tried={a.key}) == c
    s.local[c.key] = 2
    assert s.pick(view, tried={a.key}) is None


def test_ties_are_broken_by_the_injected_random_source():
    view = _view(2)
    seen = {_setup(seed=seed).pick(view).key for seed in range(20)}
    assert seen == {r.key for r in view.replicas}


def test_bound_sessions_count_as_expected_load_so_new_sessions_spread():
    s = _setup(session_load_factor=0.5)
    view = _view(2)
    placed = [s.pick(view, headers={"x-session-id": f"s{i}"}).key for i in range(10)]
    assert placed.count(view.replicas[0].key) == 5


# -- the guard -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preferred", "least", "trips"),
    [
        (10, 5, True),  # ahead by 5 (> 4) and 2x (> 1.5x)
        (5, 0, True),
        (4, 0, False),  # ahead by 4: the absolute side holds
        (30, 15, True),
        (30, 21, False),  # ahead by 9 but only 1.43x: the relative side holds
    ],
)
def test_the_guard_trips_only_when_both_sides_do(preferred, least, trips):
    assert imbalanced(preferred, least, absolute=4, relative=1.5) is trips


def _follow(s: Setup, view: LiveService, session: str) -> tuple[LiveReplica, LiveReplica]:
    """A session's first pick, then the other replica."""
    first = s.pick(view, headers={"x-session-id": session})
    other = next(r for r in view.replicas if r != first)
    return first, other


def test_a_session_stays_on_its_replica_until_the_guard_trips():
    s = _setup(balance_abs=4, balance_rel=1.5)
    view = _view(2, concurrency=64)
    first, other = _follow(s, view, "conv")
    s.scraped(first, running=4)
    s.scraped(other, running=0)
    assert s.pick(view, headers={"x-session-id": "conv"}) == first  # ahead by 4: stays
    s.scraped(first, running=9)
    s.scraped(other, running=6)  # ahead by 3 only
    assert s.pick(view, headers={"x-session-id": "conv"}) == first
    s.scraped(first, running=20)
    s.scraped(other, running=14)  # ahead by 6 but only 1.43x
    assert s.pick(view, headers={"x-session-id": "conv"}) == first
    s.scraped(first, running=22)
    s.scraped(other, running=14)  # ahead by 8 and 1.57x: both trip
    assert s.pick(view, headers={"x-session-id": "conv"}) == other
    # The session moved with it (its cache is there now).
    s.scraped(first, running=12)
    assert s.pick(view, headers={"x-session-id": "conv"}) == other


def test_a_session_leaves_a_replica_over_its_kv_ceiling_or_stale():
    s = _setup()
    view = _view(2)
    first, other = _follow(s, view, "conv")
    s.scraped(first, running=0, kv=0.95)
    s.scraped(other, running=3, kv=0.1)
    assert s.pick(view, headers={"x-session-id": "conv"}) == other


def test_a_stale_replicas_own_low_count_does_not_trip_the_guard():
    s = _setup(stale_after=5.0)
    view = _view(3, concurrency=64)
    first = s.pick(view, headers={"x-session-id": "conv"})
    others = [r for r in view.replicas if r != first]
    s.scraped(first, running=6)
    s.scraped(others[0], running=5)
    s.scraper.replicas[others[1].key] = ReplicaLoad("svc", first_seen=s.clock.now - 60)  # stale
    # 6 against the stale replica's 0 would trip both sides; against the fresh 5 it does not.
    assert s.pick(view, headers={"x-session-id": "conv"}) == first


def test_a_session_expires_after_its_ttl():
    s = _setup(session_ttl=60)
    view = _view(2)
    first, other = _follow(s, view, "conv")
    s.scraped(first, running=1)
    s.scraped(other, running=0)
    s.clock.now += 30
    assert s.pick(view, headers={"x-session-id": "conv"}) == first
    s.clock.now += 61
    s.scraped(first, running=1)
    s.scraped(other, running=0)
    assert s.pick(view, headers={"x-session-id": "conv"}) == other


def test_a_long_or_absent_session_header_gives_no_affinity_and_mints_nothing():
    s = _setup()
    view = _view(2)
    s.pick(view, headers={"x-session-id": "x" * 257})
    s.pick(view, headers={})
    assert not s.affinity.sessions
    families = {m.name: m for m in s.router.metrics.registry.collect()}
    labels = {tuple(x.labels.values()) for x in families["ficc_gateway_routing_decisions"].samples}
    assert labels <= {("svc", "score")}


def test_the_session_table_is_bounded():
    s = _setup(session_max_entries=3)
    view = _view(2)
    for i in range(10):
        s.pick(view, headers={"x-session-id": f"s{i}"})
    assert list(key for _, key in s.affinity.sessions) == ["s7", "s8", "s9"]
    assert sum(s.affinity.session_counts.values()) == 3


# -- the prefix index ------------------------------------------------------------------------

SYSTEM = "You are a helpful assistant. " * 140  # ~4 KiB, shared by every conversation


def test_a_follow_up_turn_goes_to_the_replica_that_served_its_history():
    s = _setup()
    view = _view(2, concurrency=64)
    turn1 = _chat(SYSTEM, "What is a lighthouse?")
    first = s.pick(view, payload=turn1)
    other = next(r for r in view.replicas if r != first)
    s.scraped(first, running=3)  # busier, but within the guard
    s.scraped(other, running=0)
    turn2 = _chat(SYSTEM, "What is a lighthouse?", "A tower with a light.", "Who keeps it?")
    for _ in range(5):
        assert s.pick(view, payload=turn2) == first


def _question(name: str, words: int) -> str:
    return f"{name} asks: " + " ".join(f"{name}-word-{i}" for i in range(words))


@pytest.mark.parametrize("words", [12, 60], ids=["within-a-block", "into-the-next-block"])
def test_conversations_sharing_a_system_prompt_each_go_back_to_their_own_replica(words):
    # The shared prompt's blocks are held by both replicas, and what a conversation adds
    # is less than a block: the pieces after the last block tell the two apart (12 words:
    # the follow-up still ends in the block its first turn ended in; 60: it fills that
    # block, and the first turn's pieces are found inside it).
    s = _setup()
    view = _view(2, concurrency=64)
    a, b = view.replicas
    turns = {}
    for name, replica, other in (("ann", a, b), ("bob", b, a)):
        s.scraped(replica, running=0)
        s.scraped(other, running=6)  # bob's first turn leaves ann's replica (the guard)
        turns[name] = [SYSTEM, _question(name, words)]
        assert s.pick(view, payload=_chat(*turns[name])) == replica
    first = prompt_of("/v1/chat/completions", _chat(*turns["ann"]), "svc")
    assert first.pieces, "the first turn ends in a partial block of at least one piece"
    for name, replica, other in (("ann", a, b), ("bob", b, a)):
        s.scraped(replica, running=3)  # busier, but within the guard
        s.scraped(other, running=0)
        follow = _chat(*turns[name], "A tower with a light. " * (words // 4), "Who keeps it?")
        prompt = prompt_of("/v1/chat/completions", follow, "svc")
        assert (len(prompt.blocks) > len(first.blocks)) == (words > 20)
        for _ in range(5):
            assert s.pick(view, payload=follow) == replica


def test_a_prefix_match_under_the_minimum_or_the_ratio_is_not_acted_on():
    s = _setup(prefix_min_match=2048, prefix_match_ratio=0.5)
    view = _view(2, concurrency=64)
    short = _chat("x" * 1500)
    first = s.pick(view, payload=short)
    other = next(r for r in view.replicas if r != first)
    s.scraped(first, running=1)
    s.scraped(other, running=0)
    assert s.pick(view, payload=_chat("x" * 1500, "a", "more")) == other  # < 2 KiB matched
    # 4 KiB matched of a 16 KiB prompt is a quarter: load decides.
    s2 = _setup(prefix_min_match=1024, prefix_match_ratio=0.5)
    first = s2.pick(view, payload=_chat("y" * 4096))
    other = next(r for r in view.replicas if r != first)
    s2.scraped(first, running=1)
    s2.scraped(other, running=0)
    assert s2.pick(view, payload=_chat("y" * 4096 + "z" * 12000)) == other


def test_prefix_entries_expire_after_their_ttl():
    s = _setup(prefix_ttl=60)
    view = _view(2, concurrency=64)
    turn1 = _chat(SYSTEM, "hello")
    first = s.pick(view, payload=turn1)
    other = next(r for r in view.replicas if r != first)
    s.scraped(first, running=1)
    s.scraped(other, running=0)
    s.clock.now += 61
    s.scraped(first, running=1)
    s.scraped(other, running=0)
    assert s.pick(view, payload=_chat(SYSTEM, "hello", "hi", "again")) == other


def test_the_prefix_index_is_bounded_least_recently_used_first():
    s = _setup(prefix_max_entries=8)
    view = _view(2)
    for i in range(5):
        s.pick(view, payload=_chat(f"{i}" * 4096))
    assert len(s.affinity.prefixes) == 8


def test_the_same_prompt_of_another_service_is_another_prefix():
    chat_path = "/v1/chat/completions"
    payload = _chat(SYSTEM)
    prompt = prompt_of(chat_path, payload, "a")
    assert prompt.length == len(payload) - payload.index(b'"messages"')
    assert len(prompt.blocks) == prompt.length // BLOCK
    assert len(prompt.pieces) == prompt.length % BLOCK // PIECE
    other = prompt_of(chat_path, payload, "b")
    assert not set(prompt.blocks + prompt.pieces) & set(other.blocks + other.pieces)
    # Only the prompt counts: fields before the messages do not shift the blocks.
    moved = prompt_of(chat_path, b'{"temperature":0.5,' + payload[1:], "a")
    assert (moved.blocks, moved.pieces) == (prompt.blocks, prompt.pieces)
    assert prompt_of("/v1/embeddings", payload, "a") is None
    completion = json.dumps({"prompt": "p" * (3 * BLOCK + PIECE)}).encode()
    assert len(prompt_of("/v1/completions", completion, "a").blocks) == 3
    # A prompt under a block has no pieces: they are only read after a block.
    assert prompt_of(chat_path, _chat("short " * 50), "a").pieces == ()


@given(
    st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]),
    st.binary(max_size=3 * BLOCK),
    st.binary(max_size=3 * BLOCK),
)
def test_any_payload_hashes_to_bounded_blocks_and_pieces_and_routes(path, head, tail):
    payload = head + b'"messages": [' + tail if path.endswith("chat/completions") else head
    prompt = prompt_of(path, payload, "svc")
    if prompt is not None:
        assert len(prompt.blocks) == prompt.length // BLOCK
        expected = prompt.length % BLOCK // PIECE if prompt.blocks else 0
        assert len(prompt.pieces) == expected <= BLOCK // PIECE - 1
    s = _setup()
    view = _view(2, concurrency=64)
    first = s.pick(view, payload=payload, path=path)
    assert s.pick(view, payload=payload + b" more", path=path) in view.replicas
    assert first in view.replicas


def test_a_request_releases_its_payload_once_hashed():
    s = _setup()
    view = _view(2)
    request = routing_request(view, payload=_chat(SYSTEM))
    first = s.router.pick(view, set(), request)
    assert request.payload == b"" and request.prefix.blocks and request.prefix.length > 4096
    # A retry picks again from the hashes alone, and indexes them on its replica.
    assert s.router.pick(view, {first.key}, request) not in (None, first)


def test_the_guard_keeps_a_shared_prefix_from_piling_load_on_one_replica():
    s = _setup(balance_abs=2, balance_rel=1.5)
    view = _view(2, concurrency=64)
    sent = []
    for i in range(12):
        replica = s.pick(view, payload=_chat(SYSTEM, f"question {i}"))
        sent.append(replica)
        s.local[replica.key] = s.local.get(replica.key, 0) + 1  # all stay in flight
    counts = sorted(sent.count(r) for r in view.replicas)
    assert counts[1] - counts[0] <= 3  # never more than the guard's gap apart


# -- forgetting replicas ---------------------------------------------------------------------


def test_affinity_forgets_a_replica_that_left_and_never_follows_its_successor():
    s = _setup()
    view = _view(2, concurrency=64)
    turn1 = _chat(SYSTEM, "hello")
    first = s.pick(view, payload=turn1, headers={"x-session-id": "conv"})
    other = next(r for r in view.replicas if r != first)
    s.router.sweep({first.key, other.key})
    # A restart replaces `first` by a new attempt at the same index: another engine process.
    successor = attrs.evolve(first, fence=new_fence(2))
    moved = attrs.evolve(
        view, replicas=(successor, other) if first.index == 0 else (other, successor)
    )
    s.router.sweep({successor.key, other.key})
    assert not any(first.key in e.holders for e in s.affinity.prefixes.values())
    assert first.key not in {b.replica for b in s.affinity.sessions.values()}
    assert first.key not in s.affinity.session_counts
    s.scraped(successor, running=1)
    s.scraped(other, running=0)
    turn2 = _chat(SYSTEM, "hello", "hi", "again")
    assert s.pick(moved, payload=turn2, headers={"x-session-id": "conv"}) == other


def test_the_scraper_forgets_a_replica_that_left_and_its_series():
    s = _setup()
    view = _view(2)
    a, b = view.replicas
    s.scraped(a, running=1)
    s.scraped(b, running=1)
    s.router.metrics.routing_scraped_running.labels("svc", a.key).set(1)
    s.scraper.forget(a.key)
    assert a.key not in s.scraper.replicas
    samples = {
        x.labels["replica"]
        for m in s.router.metrics.registry.collect()
        if m.name == "ficc_gateway_engine_running_requests"
        for x in m.samples
    }
    assert a.key not in samples


# -- the scraper's reads (a fake endpoint action: the edge to a node) ------------------------


class _Endpoint:
    def __init__(self, events=(), *, refuse: FiccError | None = None, hang: bool = False):
        self.events = list(events)
        self.refuse = refuse
        self.hang = hang
        self.cancelled: list[str] = []

    async def open(self, fence, stream_id, method, path, headers, body):
        assert (method, path) == ("GET", "/metrics")
        if self.refuse is not None:
            raise self.refuse

    async def read(self, fence, stream_id):
        if self.hang:
            await trio.sleep_forever()
        return self.events.pop(0)

    async def cancel(self, fence, stream_id):
        self.cancelled.append(stream_id)


class _Nodes:
    def __init__(self, endpoint):
        self.endpoint_action = endpoint

    def endpoint(self, node_id):
        return self.endpoint_action


def _scraper_for(endpoint, view: LiveService) -> tuple[Scraper, Metrics]:
    live = LiveTable()
    live.publish(view)
    metrics = Metrics()
    scraper = Scraper(live, _Nodes(endpoint), lambda key: 2, metrics, interval=1, timeout=0.5)
    return scraper, metrics


async def test_a_round_records_the_engines_figures_and_the_in_flight_count_then(autojump_clock):
    view = _view(1)
    body = VLLM_TEXT.encode()
    head = ResponseHead(status=200, headers=())
    endpoint = _Endpoint(
        [head, BodyChunk(data=body[:100]), BodyChunk(data=body[100:]), EndOfStream()]
    )
    scraper, metrics = _scraper_for(endpoint, view)
    await scraper.scrape_all()
    known = scraper.replicas[view.replicas[0].key]
    assert known.load == EngineLoad(running=5, waiting=4, kv=0.61)
    assert (known.at, known.local_at) == (trio.current_time(), 2)
    labels = {"service": "svc", "replica": view.replicas[0].key}
    assert metrics.registry.get_sample_value("ficc_gateway_engine_waiting_requests", labels) == 4
    assert metrics.registry.get_sample_value("ficc_gateway_engine_scrape_age_seconds", labels) == 0


@pytest.mark.parametrize(
    "endpoint",
    [
        _Endpoint(hang=True),
        _Endpoint([ResponseHead(status=500, headers=()), EndOfStream()]),
        _Endpoint(
            [ResponseHead(status=200, headers=())]
            + [BodyChunk(data=b"#" * 65536)] * 17
            + [EndOfStream()]
        ),
        _Endpoint(refuse=FiccError("the node is not connected", code="node_unavailable")),
    ],
    ids=["timeout", "status", "too-large", "node-unavailable"],
)
async def test_a_failed_read_is_counted_and_keeps_the_last_figures(endpoint, autojump_clock):
    view = _view(1)
    scraper, metrics = _scraper_for(endpoint, view)
    key = view.replicas[0].key
    with trio.fail_after(5):
        await scraper.scrape_all()
    assert scraper.replicas[key].load is None and not scraper.replicas[key].unscraped
    labels = {"service": "svc", "replica": key}
    assert (
        metrics.registry.get_sample_value("ficc_gateway_engine_scrape_failures_total", labels) == 1
    )
    if endpoint.hang or endpoint.events:
        assert endpoint.cancelled  # the stream left open was cancelled


async def test_an_engine_that_admits_no_metrics_is_not_read_again(autojump_clock):
    view = _view(1)
    refusal = FiccError("not admitted", code="path_not_admitted")
    endpoint = _Endpoint(refuse=refusal)
    scraper, _ = _scraper_for(endpoint, view)
    await scraper.scrape_all()
    assert scraper.replicas[view.replicas[0].key].unscraped
    endpoint.refuse = AssertionError("read again")  # type: ignore[assignment]
    await scraper.scrape_all()
