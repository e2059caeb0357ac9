"""The soak bench's traffic records and the invariants checked at its end.

:mod:`chaos_bench` starts the installation and the faults; this module holds what a
client saw (one :class:`Outcome` per request) and the six checks, each a
:class:`Verdict` that is printed whether it holds or not.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import attrs

#: What a client saw of one request.
ANSWERED = "answered"  # a whole answer (2xx; a stream ending in [DONE])
REFUSED = "refused"  # an error in the API's envelope, before or inside a stream
LOST = "lost"  # the connection dropped while the controller it went to was down
HUNG = "hung"  # no answer within the client's deadline
BROKEN = "broken"  # anything else: a bare error, a stream cut without an error event


@attrs.define
class Outcome:
    kind: str  # chat, stream, upload, control
    key: str  # project, personal, admin
    controller: str
    began: float
    ended: float
    result: str
    code: str = ""
    detail: str = ""


def envelope_code(body: bytes) -> str | None:
    """The ``error.code`` of an API envelope, or ``None`` when ``body`` is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str) and error.get("message"):
        return error["code"]
    return None


def stream_result(lines: list[str]) -> tuple[str, str]:
    """Classify a 200 stream's lines: answered, refused (an error event), or broken."""
    if "data: [DONE]" in lines:
        return ANSWERED, ""
    for line in lines:
        if line.startswith("data: "):
            code = envelope_code(line[6:].encode())
            if code is not None:
                return REFUSED, code
    return BROKEN, f"stream ended without [DONE] or an error event: {lines[-3:]!r}"


@attrs.define
class Verdict:
    name: str
    held: bool
    summary: str
    details: list[str] = attrs.Factory(list)

    def lines(self) -> list[str]:
        mark = "held  " if self.held else "FAILED"
        return [f"[{mark}] {self.name}: {self.summary}", *(f"         {d}" for d in self.details)]


#: Codes that are a defect, not a designed refusal: they fail the requests' invariant.
DEFECTS = frozenset({"internal_error"})


def check_requests(outcomes: list[Outcome]) -> Verdict:
    """Every request answered or refused by design; a hang, a break or a 500 is a defect."""
    counts = Counter(o.result for o in outcomes)
    bad = [
        o
        for o in outcomes
        if o.result in (HUNG, BROKEN) or (o.result == REFUSED and o.code in DEFECTS)
    ]
    by_kind = Counter((o.kind, o.result) for o in outcomes)
    summary = (
        f"{len(outcomes)} requests: {counts[ANSWERED]} answered, {counts[REFUSED]} refused "
        f"in the envelope, {counts[LOST]} lost with the controller they went to, "
        f"{counts[HUNG]} hung past the deadline, {counts[BROKEN]} broken, "
        f"{sum(o.code in DEFECTS for o in outcomes if o.result == REFUSED)} internal errors"
    )
    details = [", ".join(f"{k}/{r} {n}" for (k, r), n in sorted(by_kind.items()))]
    codes = Counter(o.code for o in outcomes if o.result == REFUSED)
    if codes:
        details.append("refusals by code: " + ", ".join(f"{c} {n}" for c, n in codes.most_common()))
    details += [
        f"{o.kind} via {o.controller} at +{o.began:.1f}s: {o.result} {o.code} {o.detail}"
        for o in bad[:8]
    ]
    return Verdict("every request answered or refused in the envelope", not bad, summary, details)


def check_usage(
    outcomes: list[Outcome], usage: dict | None, warmup: int, kills: list[tuple[str, float]]
) -> Verdict:
    """Usage's successful requests equal the invoke requests answered; one that was lost
    with its controller may or may not have been recorded before it went.

    ``kills`` (controller, when it was SIGKILLed) only explain a shortfall: the requests
    a controller answered in the 2 s before it was killed are counted in the details
    (its usage buffer is written every ``usage_flush_interval``, 1 s)."""
    name = "usage records equal the requests answered"
    if usage is None:
        return Verdict(name, False, "the usage route did not answer")
    totals = usage["totals"]
    ok = totals["requests"] - totals["errors"]
    invokes = [o for o in outcomes if o.kind in ("chat", "stream")]
    answered = sum(o.result == ANSWERED for o in invokes) + warmup
    lost = sum(o.result == LOST for o in invokes)
    held = answered <= ok <= answered + lost
    summary = (
        f"usage says {totals['requests']} requests, {ok} without error; clients saw "
        f"{answered} answered (warm-up {warmup} included), {lost} lost in flight"
    )
    details = [f"errors by code: {totals.get('errors_by_code')}"]
    for controller, at in kills:
        late = sum(
            o.result == ANSWERED and o.controller == controller and at - 2 <= o.ended <= at
            for o in invokes
        )
        details.append(
            f"{controller} SIGKILLed at +{at:.1f}s had answered {late} in the 2 s before"
        )
    return Verdict(name, held, summary, details)


def engine_pids(marker: str) -> dict[int, str]:
    """Live llama.cpp servers whose command line names ``marker`` (the bench's agent
    directory, where their model blob is): the installation's engines, whatever became
    of the agent that started them."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        command = raw.replace(b"\0", b" ").decode(errors="replace")
        if marker in command and "llama-server" in command and state != "Z":
            found[int(entry.name)] = command
    return found


def check_orphans(live: dict[int, str], known: set[int], after_stop: dict[int, str]) -> Verdict:
    orphans = sorted(set(live) - known)
    summary = (
        f"{len(live)} engine processes at the end, {len(known)} of them a replica's; "
        f"{len(after_stop)} left after the installation stopped"
    )
    details = [f"pid {p}: {live[p][:160]}" for p in orphans]
    details += [f"left after stop: pid {p}: {c[:160]}" for p, c in after_stop.items()]
    return Verdict("no orphaned engine process", not orphans and not after_stop, summary, details)


def check_commitment(samples: list[tuple[float, int]], bound: int, node: dict | None) -> Verdict:
    worst = max((n for _, n in samples), default=0)
    over = [(t, n) for t, n in samples if n > bound]
    summary = (
        f"{len(samples)} samples of the node's engines: at most {worst} at once "
        f"(its placements: {bound})"
    )
    if over:
        summary += (
            f"; {len(over)} samples over, the longest run of them {_longest(samples, bound):.1f} s"
        )
    details = [f"+{t:.1f}s: {n} engines" for t, n in over[:5]]
    if node is not None:
        details.append(f"node at the end: {json.dumps(node)[:300]}")
    return Verdict("no node over-committed", not over, summary, details)


def _longest(samples: list[tuple[float, int]], bound: int) -> float:
    """Seconds from the first to the last sample of the longest run of samples over ``bound``."""
    longest, start = 0.0, None
    for t, n in samples:
        if n > bound:
            start = t if start is None else start
            longest = max(longest, t - start)
        else:
            start = None
    return longest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_blobs(data_dir: Path, models: list[dict] | None) -> Verdict:
    """Every published blob's content hashes to its name; every verified model's files
    are published."""
    name = "every published blob verifies"
    published = data_dir / "blobs" / "sha256"
    blobs = sorted(published.iterdir()) if published.is_dir() else []
    wrong = [p.name for p in blobs if _sha256(p) != p.name]
    missing = []
    for model in models or []:
        if model.get("state") != "verified":
            continue
        for file in model.get("files", []):
            sha = file.get("sha256", "")
            if not (published / sha).is_file():
                missing.append(f"{model['id']} {file.get('path')}: {sha[:12]} not published")
    verified = sum(m.get("state") == "verified" for m in models or [])
    summary = f"{len(blobs)} published blobs hashed, {verified} verified models"
    details = [f"{sha[:16]}... does not hash to its name" for sha in wrong] + missing
    if models is None:
        details.append("the models route did not answer")
    return Verdict(name, not wrong and not missing and models is not None, summary, details)


def check_restarts(events: list[dict] | None, status: dict | None, asked: int) -> Verdict:
    """Every attempt after a replica's first in its generation has a ``replica.restarted``
    event with a reason, and each replica's restart count matches those events."""
    name = "the event log explains every replica restart"
    if events is None or status is None:
        return Verdict(name, False, "the events or status route did not answer")
    explained: dict[tuple[int, int], set[int]] = {}
    for event in events:
        if event["kind"] == "replica.restarted" and event.get("reason"):
            details = event.get("details") or {}
            key = (event.get("replica"), details.get("generation"))
            explained.setdefault(key, set()).add(details.get("number"))
    attempts: dict[tuple[int, int], set[int]] = {}
    for event in events:
        if event["kind"] in ("attempt.created", "attempt.state") and event.get("attempt_id"):
            details = event.get("details") or {}
            number = details.get("number")
            if number is None:
                continue
            key = (event.get("replica"), details.get("generation"))
            attempts.setdefault(key, set()).add(number)
    unexplained = []
    for key, numbers in sorted(attempts.items(), key=str):
        first = min(numbers)
        for number in sorted(numbers):
            if number != first and number not in explained.get(key, set()):
                unexplained.append(f"replica {key[0]} generation {key[1]} attempt {number}")
    for replica in status.get("replicas", []):
        key = (replica.get("index"), replica.get("generation"))
        counted = len(explained.get(key, set()))
        if replica.get("restarts") is not None and replica["restarts"] > counted:
            unexplained.append(
                f"replica {key[0]}: status counts {replica['restarts']} restarts, "
                f"the events explain {counted}"
            )
    restarts = sum(len(v) for v in explained.values())
    summary = (
        f"{len(events)} events, {restarts} replica.restarted with a reason for "
        f"{sum(len(v) - 1 for v in attempts.values())} later attempts; {asked} restarts asked"
    )
    reasons = Counter(e.get("reason") for e in events if e["kind"] == "replica.restarted")
    details = [f"restart reasons: {dict(reasons)}"] + [f"unexplained: {u}" for u in unexplained]
    return Verdict(name, not unexplained, summary, details)


def data_dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
