"""The live routing table: a control action's closing of admission outlasts older views."""

from __future__ import annotations

from ficc_core.routing.live import LiveReplica, LiveService, LiveTable
from ficc_core.schema import Fence


def _view(admission: str = "serving") -> LiveService:
    fence = Fence(attempt_id="a-1", generation=1, plan_digest="sha256:" + "ab" * 32)
    return LiveService(
        id="svc",
        project_id="p",
        alias="smol",
        generation=1,
        admission=admission,  # type: ignore[arg-type]
        concurrency=1,
        replicas=(LiveReplica(index=0, node_id="local", fence=fence),),
    )


def test_close_narrows_admission_at_once_and_wakes_waiters():
    table = LiveTable()
    table.publish(_view(), revision=4)
    changed = table.changed("svc")
    table.close("svc", "draining", revision=5)
    assert changed.is_set()
    assert table.get("svc").admission == "draining"
    assert len(table.get("svc").replicas) == 1  # in-flight requests keep their replica
    table.close("svc", "stopped", revision=6)
    assert (table.get("svc").admission, table.get("svc").replicas) == ("stopped", ())


def test_a_view_from_a_record_older_than_the_close_is_ignored():
    table = LiveTable()
    table.publish(_view(), revision=4)
    table.close("svc", "draining", revision=5)
    # A reconciler step that read the record before the drain publishes late.
    table.publish(_view("serving"), revision=4)
    assert table.get("svc").admission == "draining"
    table.publish(_view("draining"), revision=5)
    table.publish(_view("stopped"), revision=7)
    assert table.get("svc").admission == "stopped"


def test_close_never_widens_and_remove_forgets_the_floor():
    table = LiveTable()
    table.publish(_view("stopped"), revision=3)
    table.close("svc", "draining", revision=3)
    assert table.get("svc").admission == "stopped"
    table.remove("svc")
    table.publish(_view("serving"), revision=1)
    assert table.get("svc").admission == "serving"
