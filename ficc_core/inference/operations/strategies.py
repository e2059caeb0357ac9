"""How a rollout fits the node: its strategy, the capacity meanwhile, and the scale-down.

A rollout asks for a strategy (``auto`` by default) and :func:`choose` says which one it
takes and what that costs, for the preview to show before anything changes:

- ``surge``: the next generation starts *beside* the serving one, which serves until
  every next replica is ready (no capacity lost); it needs room for both at once.
- ``rolling``: in place, one replica at a time: a serving replica drains and stops,
  its successor starts where it ran, and the next follows once that one is ready.
  Capacity drops by one replica meanwhile (a one-replica service is down while its
  successor loads). It needs room for each step beside the replicas that still serve.
- ``recreate``: in place, every replica at once: nothing serves from the moment the
  serving generation stopped until the next one is ready (the model's load time). It
  needs room for the next generation alone.
- ``auto``: ``surge`` when it fits; else the rollout is refused with the strategies
  that would work, since an in-place one lowers capacity and the operator says so.

A **scale-down** (the same specification with fewer placements, its first ones) needs
room for nothing: ``auto`` applies it at once (:func:`scale_down`), without a new
generation: the replicas past the new count drain and stop.

A failed in-place rollout is given up like any other; the serving generation's
replicas it had stopped start again where they ran (their reservations stay held
until the cut-over), so the service serves again once they are loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ...events import EventKind
from ...schema import Specification, canonical_json
from ...store import Transaction
from .. import history, repository
from ..errors import PlacementFailed
from ..records import ServiceRecord
from ..specification.admission import plan_in
from ..specification.placement import Plan, plan
from ..specification.replicas import running_indices

if TYPE_CHECKING:
    from ..specification.model_context import ModelContext

#: What a rollout request may ask for.
STRATEGIES = ("auto", "surge", "rolling", "recreate")
#: What ``auto`` takes for a scale-down: applied at once, no new generation.
SCALE_DOWN = "scale_down"


@attrs.frozen(kw_only=True)
class Choice:
    """The strategy a rollout takes (or None: none that was asked for fits) and its plans."""

    requested: str
    chosen: str | None
    #: The strategies that would fit (``surge``, ``rolling``, ``recreate``, or the
    #: scale-down alone), best first.
    works: tuple[str, ...]
    #: The plan whose reservations the next generation takes (for a scale-down, the
    #: smaller specification's).
    plan: Plan
    #: The plan beside the serving generation (``surge``'s).
    beside: Plan
    #: The plan once it serves alone (beside every other service; in place's).
    alone: Plan
    serving: tuple[int, ...]
    following: tuple[int, ...]

    def least_serving(self, strategy: str) -> int:
        """The fewest replicas that serve at any moment of ``strategy``."""
        if strategy in ("surge", SCALE_DOWN):
            return min(len(self.serving), len(self.following))
        if strategy == "recreate":
            return 0
        old, new = len(self.serving), len(self.following)
        # Step k: the serving generation's replicas past k, and the k - 1 handed over.
        return min((max(old - k, 0) + k - 1 for k in range(1, new + 1)), default=0)

    def to_json(self) -> dict[str, Any]:
        """The preview's and the answer's ``strategy`` object."""
        chosen = self.chosen
        least = None if chosen is None else self.least_serving(chosen)
        return {
            "requested": self.requested,
            "chosen": chosen,
            "possible": list(self.works),
            "serving_replicas": len(self.serving),
            "next_replicas": len(self.following),
            "least_serving_replicas": least,
            "downtime": least == 0 if least is not None else None,
            "message": describe(self),
        }


def describe(choice: Choice) -> str:
    """What the chosen strategy does, in one sentence (or why none was chosen)."""
    old, new = len(choice.serving), len(choice.following)
    chosen = choice.chosen
    if chosen is None:
        return refusal_message(choice)
    if chosen == SCALE_DOWN:
        return (
            f"scale-down from {old} to {new} replica(s), applied at once: the replicas past "
            f"{new} drain and stop; nothing new starts, so it needs no room"
        )
    if chosen == "surge":
        return (
            f"the next generation ({new} replica(s)) starts beside the serving one, which "
            "serves until every next replica is ready: no capacity is lost"
        )
    if chosen == "recreate":
        return (
            f"every serving replica ({old}) stops, then the next generation ({new}) starts "
            "in their place: no replica serves until it is ready (downtime: the model's "
            "load time); if it fails, the serving generation starts again"
        )
    least = choice.least_serving(chosen)
    down = (
        " (downtime: a one-replica service is down while its successor loads)" if least == 0 else ""
    )
    return (
        f"one replica at a time: a serving replica stops and its successor starts in its "
        f"place; at least {least} of {old} replica(s) serve meanwhile{down}; if it fails, "
        "the replicas already replaced start again in the serving generation"
    )


def refusal_message(choice: Choice) -> str:
    """Why the requested strategy does not fit, and the way forward."""
    requested = choice.requested
    if requested in ("auto", "surge"):
        why = (
            "the next generation does not fit beside the serving one (strategy "
            f"{requested!r} needs room for both until the cut-over)"
        )
    elif requested == "rolling":
        why = (
            "a rolling rollout does not fit: one of its steps has no room for the next "
            "replica beside the replicas still serving"
        )
    else:
        why = "the next generation does not fit on its nodes even in place of the serving one"
    others = [w for w in choice.works if w != requested]
    if not others:
        return (
            f"{why}; give it smaller limits or other placements (preview the rollout to "
            "see every reason)"
        )
    ways = " or ".join(f"strategy {w!r}" for w in others)
    in_place = [w for w in others if w != "surge"]
    if not in_place:
        return f"{why}; {ways} fits ('ficc inference rollout SERVICE --strategy surge')"
    return (
        f"{why}; roll it out with {ways} ('ficc inference rollout SERVICE --strategy "
        f"{in_place[0]}'), which lowers capacity meanwhile (preview the rollout to see "
        "by how much)"
    )


def refuse_choice(choice: Choice) -> PlacementFailed:
    """The refusal of a rollout whose strategy does not fit, naming those that would."""
    beside = choice.requested in ("auto", "surge")
    reasons = (choice.beside if beside else choice.alone).reasons()
    if not reasons:
        reasons = choice.beside.reasons()  # in place fits alone, not some rolling step
    first = f": {reasons[0]['message']}" if reasons else ""
    return PlacementFailed(
        refusal_message(choice) + first,
        details={
            "strategy": choice.requested,
            "possible": list(choice.works),
            "reasons": reasons,
            "plan": (choice.beside if beside else choice.alone).to_json(),
        },
    )


def is_scale_down(current: Specification, following: Specification) -> bool:
    """Whether ``following`` is ``current`` with only its last placements left out."""
    count = len(following.placements)
    if count >= len(current.placements):
        return False
    shorter = attrs.evolve(current, placements=current.placements[:count])
    return canonical_json(shorter) == canonical_json(following)


def _rolling_fits(
    tx: Transaction,
    record: ServiceRecord,
    specification: Specification,
    model: ModelContext,
    generation: int,
    serving: Sequence[int],
    following: Sequence[int],
) -> bool:
    """Whether each step of a rolling rollout fits: the first ``k`` next replicas beside
    every other service and the serving replicas past ``k``."""
    others = repository.reservations_but(tx, record.id)
    own = [r for r in repository.reservations(tx, record.id) if r.generation == record.generation]
    nodes = repository.placement_nodes(
        tx, list(dict.fromkeys(p.node_id for p in specification.placements))
    )
    for k in range(1, len(following) + 1):
        still = set(serving[k:])
        result = plan(
            record.id,
            specification,
            nodes,
            others + [r for r in own if r.replica in still],
            model_bytes=model.size,
            model_revision=model.record.revision,
            generation=generation,
            held=following[:k],
        )
        if not result.fits:
            return False
    return True


def choose(
    tx: Transaction,
    record: ServiceRecord,
    specification: Specification,
    model: ModelContext,
    generation: int,
    requested: str = "auto",
) -> Choice:
    """The strategy a rollout of ``record`` to ``specification`` takes (module docs)."""
    current = record.specification()
    serving = running_indices(current, record.active)
    following = running_indices(specification, record.active)
    alone = plan_in(tx, record.id, specification, model, generation=generation, held=following)
    beside = plan_in(
        tx,
        record.id,
        specification,
        model,
        generation=generation,
        beside_own=True,
        held=following,
        action="rollout",
    )
    works: list[str] = []
    if requested == "auto" and is_scale_down(current, specification):
        smaller = plan_in(
            tx, record.id, specification, model, generation=record.generation, held=following
        )
        return Choice(
            requested=requested,
            chosen=SCALE_DOWN,
            works=(SCALE_DOWN,),
            plan=smaller,
            beside=beside,
            alone=alone,
            serving=serving,
            following=following,
        )
    if beside.fits:
        works.append("surge")
    if alone.fits and _rolling_fits(
        tx, record, specification, model, generation, serving, following
    ):
        works.append("rolling")
    if alone.fits:
        works.append("recreate")
    if requested == "auto":
        chosen = "surge" if "surge" in works else None
    else:
        chosen = requested if requested in works else None
    return Choice(
        requested=requested,
        chosen=chosen,
        works=tuple(works),
        plan=beside if chosen in (None, "surge") else alone,
        beside=beside,
        alone=alone,
        serving=serving,
        following=following,
    )


def scale_down(
    tx: Transaction, record: ServiceRecord, specification: Specification, result: Plan, now: float
) -> None:
    """Apply a scale-down at once: the service's specification loses its last placements
    (same generation); their replicas drain and stop, and their reservations go once
    their ends are confirmed."""
    before = len(record.specification().placements)
    after = len(specification.placements)
    repository.update_service(
        tx,
        attrs.evolve(
            record,
            spec=canonical_json(specification).decode("utf-8"),
            plan_digest=result.digest,
            reason=None,
        ),
        now,
    )
    changed = repository.service(tx, record.id)
    assert changed is not None
    history.service_event(
        tx,
        changed,
        EventKind.SERVICE_ROLLOUT,
        now,
        reason=SCALE_DOWN,
        message=f"scaled down from {before} to {after} replica(s) in place: the replicas past "
        f"{after} drain and stop",
        details={"replicas_before": before, "replicas_after": after},
    )
