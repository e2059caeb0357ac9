"""``ficc serve`` tunes the cyclic collector once start-up is done (``settle_heap``)."""

from __future__ import annotations

import gc
import weakref

from ficc_core.cli.serve import YOUNG_GENERATION_THRESHOLD, settle_heap


class _Cycle:
    __slots__ = ("__weakref__", "me")

    def __init__(self) -> None:
        self.me = self


def test_the_start_up_heap_is_frozen_and_the_young_generation_collected_later() -> None:
    before = gc.get_threshold()
    gc.collect()
    garbage = _Cycle()  # start-up's garbage: collected first, never frozen for good
    dead = weakref.ref(garbage)
    del garbage
    try:
        settle_heap()
        assert dead() is None
        assert gc.get_freeze_count() > 1000  # the start-up heap, walked no more
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, *before[1:])
        assert gc.isenabled()
        # A cycle made later is still found (the collector is tuned, not off).
        gc.collect()
        later = _Cycle()
        del later
        assert gc.collect() == 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
