"""Which attempts route and which retire when two attempts of a replica, or two
generations of a service, coexist (pure functions of the attempts)."""

from __future__ import annotations

from ficc_core.inference.reconciliation.publication import latest, retiring, routed
from ficc_core.inference.records import AttemptRecord, AttemptState


def _attempt(replica: int, generation: int, number: int, state: str, node: str = "n1", **kw):
    return AttemptRecord(
        attempt_id=f"r{replica}.g{generation}.a{number}",
        service_id="s",
        replica=replica,
        generation=generation,
        number=number,
        node_id=node,
        provider="process",
        plan_digest="sha256:" + "1" * 64,
        state=AttemptState(state),
        created_at=0,
        updated_at=0,
        **kw,
    )


def _ids(attempts) -> list[str]:
    return sorted(a.attempt_id for a in attempts)


def test_a_loading_successor_leaves_its_predecessor_serving_and_both_are_kept():
    source = _attempt(0, 1, 1, "ready")
    target = _attempt(0, 1, 2, "loading", node="n2")
    attempts = [source, target]
    assert routed(attempts, 1, 1) == {0: source}
    assert latest(attempts, 1) == {0: source}
    assert retiring(attempts, {1: 1}) == []


def test_a_ready_successor_serves_and_its_predecessor_retires():
    source = _attempt(0, 1, 1, "ready")
    target = _attempt(0, 1, 2, "ready", node="n2")
    attempts = [source, target]
    assert routed(attempts, 1, 1) == {0: target}
    assert _ids(retiring(attempts, {1: 1})) == [source.attempt_id]


def test_a_failed_successor_leaves_the_predecessor_serving():
    source = _attempt(0, 1, 1, "ready")
    target = _attempt(0, 1, 2, "failed", node="n2", released=True)
    attempts = [source, target]
    assert routed(attempts, 1, 1) == {0: source}
    assert retiring(attempts, {1: 1}) == []


def test_a_pending_rollout_is_not_routed_and_the_previous_generation_retires_after_it():
    old = [_attempt(0, 1, 1, "ready"), _attempt(1, 1, 1, "ready")]
    new = [_attempt(i, 2, 1, "ready") for i in range(3)]
    attempts = [*old, *new]
    # Before the cut-over: generation 1 serves, generation 2 waits; nothing retires.
    assert _ids(routed(attempts, 1, 2).values()) == _ids(old)
    assert retiring(attempts, {1: 2, 2: 3}) == []
    # After it: generation 2 serves, generation 1 retires.
    assert _ids(routed(attempts, 2, 3).values()) == _ids(new)
    assert _ids(retiring(attempts, {2: 3})) == _ids(old)
    # An abandoned rollout: generation 1 still serves, generation 2 retires.
    assert _ids(retiring(attempts, {1: 2})) == _ids(new)


def test_a_dismissed_attempt_is_never_routed_and_retires():
    one = _attempt(0, 1, 1, "ready")
    attempts = [one, _attempt(1, 1, 1, "ready")]
    assert 0 not in routed(attempts, 1, 2, dismissed={one.attempt_id})
    assert _ids(retiring(attempts, {1: 2}, {one.attempt_id: "restart_requested"})) == [
        one.attempt_id
    ]


def test_an_unknown_outcome_is_kept_not_routed():
    lost = _attempt(0, 1, 1, "unknown")
    assert routed([lost], 1, 1) == {}
    assert retiring([lost], {1: 1}) == []
