"""Priority bands: the settings, how a request's band is decided, and admission by band.

Admission is driven directly (the real :class:`Admission`, :class:`RequestChecks`,
:class:`LiveTable`, :class:`Authority` and Prometheus registry; no engine is needed
to hold a slot), with trio's autojump clock where time passes.
"""

from __future__ import annotations

import json
import math
import random
import time
from itertools import count

import attrs
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from ficc_core.auth.authority import Authority
from ficc_core.auth.principal import Principal, PrincipalKind
from ficc_core.base.errors import ConfigError, FiccError
from ficc_core.config import load_config, render_reference
from ficc_core.controller.metrics import Metrics
from ficc_core.gateway.accounting import Accounting
from ficc_core.gateway.admission import Admission
from ficc_core.gateway.checks import RequestChecks
from ficc_core.gateway.errors import NoReadyReplica, ServiceSaturated
from ficc_core.gateway.request import Request
from ficc_core.gateway.scoring import router_from_config
from ficc_core.routing.bands import Band, BandTable, UnknownBand, parse_bands
from ficc_core.routing.live import LiveReplica, LiveService, LiveTable
from ficc_core.testing.executor_kit import new_fence

BANDS = "interactive:100:1.0,standard:50:1.0,batch:10:0.75"

# -- settings ------------------------------------------------------------------------------


def test_bands_come_from_a_toml_array_of_tables_an_environment_string_or_a_flag(tmp_path):
    path = tmp_path / "ficc.toml"
    path.write_text(
        "bands = [\n"
        '  {name = "live", priority = 90, saturation_ceiling = 1.0},\n'
        '  {name = "bulk", priority = 5, saturation_ceiling = 0.5},\n'
        "]\n"
        'band_default = "bulk"\n'
    )
    from_file = load_config(path, environ={})
    assert from_file.bands == (Band("live", 90, 1.0), Band("bulk", 5, 0.5))
    assert from_file.band_default == "bulk"
    # Highest priority first, whatever the order written.
    from_env = load_config(
        environ={"FICC_BANDS": "low:1:0.5, high:9:1", "FICC_BAND_DEFAULT": "low"}
    )
    assert [band.name for band in from_env.bands] == ["high", "low"]
    from_flag = load_config(environ={}, overrides={"bands": "a:2:1,b:1:0.25", "band_default": "b"})
    assert from_flag.bands == (Band("a", 2, 1.0), Band("b", 1, 0.25))


def test_the_default_bands_keep_the_default_band_at_full_capacity():
    config = load_config(environ={})
    table = BandTable(config.bands, config.band_default)
    assert [(b.name, b.priority) for b in table.ordered] == [
        ("interactive", 100),
        ("standard", 50),
        ("batch", 10),
    ]
    assert table.default.saturation_ceiling == 1.0
    assert config.band_header == "x-ficc-band"
    assert "`interactive:100:1,standard:50:1,batch:10:0.75`" in render_reference()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"FICC_BANDS": "a:1:1,a:2:1"}, "share the name 'a'"),
        ({"FICC_BANDS": "a:1:1,b:1:1"}, "share the priority 1"),
        ({"FICC_BANDS": "a:1:0"}, "above 0 and at most 1"),
        ({"FICC_BANDS": "a:1:1.5"}, "above 0 and at most 1"),
        ({"FICC_BANDS": "a:1:nan"}, "above 0 and at most 1"),
        ({"FICC_BANDS": "a:x:1"}, "priority must be an integer"),
        ({"FICC_BANDS": "a:1"}, "not name:priority:ceiling"),
        ({"FICC_BANDS": "Has Space:1:1"}, "not a band name"),
        ({"FICC_BANDS": ""}, "at least one band"),
        ({"FICC_BAND_DEFAULT": "gold"}, "band_default: 'gold' is not one of the bands"),
        ({"FICC_BAND_MIN_SHARE": "1"}, "band_min_share"),
        ({"FICC_BAND_MIN_SHARE": "0.6"}, "band_min_share"),
        ({"FICC_BAND_MIN_SHARE": "-0.1"}, "band_min_share"),
        ({"FICC_BAND_MIN_SHARE": "lots"}, "band_min_share must be a float"),
        ({"FICC_BAND_HEADER": "x band"}, "not an HTTP header name"),
        ({"FICC_BAND_QUEUE_CAPACITY": "0"}, "band_queue_capacity"),
        ({"FICC_BAND_QUEUE_TTL": "0"}, "band_queue_ttl"),
    ],
)
def test_bad_band_settings_are_refused_naming_what_is_wrong(environ, message):
    with pytest.raises(ConfigError, match=message):
        load_config(environ=environ)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('bands = [{name = "a", priority = 1}]\n', "missing: saturation_ceiling"),
        ('bands = [{name = "a", priority = 1, saturation_ceiling = 1, x = 2}]\n', "unknown: x"),
        ('bands = [{name = "a", priority = 1.5, saturation_ceiling = 1}]\n', "integer"),
        ('bands = [{name = "a", priority = true, saturation_ceiling = 1}]\n', "integer"),
        ('bands = [{name = "a", priority = 1, saturation_ceiling = "x"}]\n', "a number"),
        ("bands = 3\n", "expected a list of bands"),
    ],
)
def test_bad_band_tables_are_refused_with_the_file_named(tmp_path, document, message):
    path = tmp_path / "bad.toml"
    path.write_text(document)
    with pytest.raises(ConfigError, match=message) as refused:
        load_config(path, environ={})
    assert str(path) in refused.value.message


def test_a_band_ceiling_leaves_headroom_but_never_shuts_a_band_out():
    batch = Band("batch", 10, 0.75)
    assert [batch.slots(capacity) for capacity in (1, 2, 4, 8, 100)] == [1, 1, 3, 6, 75]
    assert Band("x", 1, 0.3).slots(10) == 3  # 0.3 x 10 is 3, not 2.999...
    assert parse_bands(BANDS) == parse_bands(list(parse_bands(BANDS)))


# -- a request's band ---------------------------------------------------------------------


def test_the_band_is_the_credentials_else_the_projects_else_the_default():
    table = BandTable(parse_bands(BANDS), "standard")
    assert table.entitled("interactive", "batch").name == "interactive"
    assert table.entitled(None, "batch").name == "batch"
    assert table.entitled(None, None).name == "standard"
    # A stored band the settings no longer list counts as none.
    assert table.entitled("gold", None).name == "standard"
    assert table.entitled("gold", "interactive").name == "interactive"


def test_a_band_header_only_lowers_the_band():
    table = BandTable(parse_bands(BANDS), "standard")
    standard = table.require("standard")
    assert table.effective(standard, None) is standard
    assert table.effective(standard, "batch").name == "batch"
    assert table.effective(standard, " Batch ").name == "batch"
    # Naming a higher band is served at the entitled one, never promoted.
    assert table.effective(standard, "interactive") is standard
    assert table.effective(table.require("batch"), "standard").name == "batch"
    with pytest.raises(UnknownBand) as refused:
        table.effective(standard, "gold")
    assert refused.value.status == 400
    assert refused.value.code == "unknown_band"
    assert refused.value.details["bands"] == ["interactive", "standard", "batch"]


# -- admission by band --------------------------------------------------------------------

_ids = count()


class Bench:
    """One service's admission with the given settings, and requests to drive it."""

    def __init__(self, *, concurrency: int = 1, replicas: int = 1, **settings: str) -> None:
        config = load_config(
            environ={}, overrides={"bands": BANDS, "band_queue_ttl": "1h", **settings}
        )
        self.metrics = Metrics()
        self.live = LiveTable()
        # The real revocation check; it reads no store for a principal it was handed.
        self.authority = Authority(None, clock=time.time)  # type: ignore[arg-type]
        checks = RequestChecks(self.authority, self.live, max_body_bytes=1 << 20)  # type: ignore[arg-type]
        load: dict[str, int] = {}
        rng = random.Random(7)
        # The gateway's router, as Gateway builds it (no scraper runs: in-flight only).
        router = router_from_config(
            config,
            live=self.live,
            contributors=None,  # type: ignore[arg-type]
            local=lambda replica_key: load.get(replica_key, 0),
            metrics=self.metrics,
            rng=rng,
        )
        self.admission = Admission(
            checks,
            Accounting(self.metrics),
            router=router,
            load=load,
            rng=rng,
            config=config,
            queue_factor=4,
            max_queue_wait=math.inf,
            recheck_interval=0.25,
        )
        self.view = LiveService(
            id="svc",
            project_id="p",
            alias="m",
            generation=1,
            admission="serving",
            concurrency=concurrency,
            replicas=tuple(
                LiveReplica(index=i, node_id="n", fence=new_fence(1)) for i in range(replicas)
            ),
        )
        self.live.publish(self.view)
        #: Requests in the order they got a slot.
        self.granted: list[Request] = []

    def request(
        self, band: str | None = None, *, header: str | None = None, deadline: float = math.inf
    ) -> Request:
        actor = Principal(
            kind=PrincipalKind.CREDENTIAL,
            id=f"c{next(_ids)}",
            project_id="p",
            project_name="p",
            scopes=frozenset({"inference:invoke"}),
            band=band,
        )
        now = trio.current_time()
        return Request(
            service_id="svc",
            path="/v1/chat/completions",
            actor=actor,
            view=self.view,
            headers={} if header is None else {"x-ficc-band": header},
            started=now,
            deadline=now + deadline,
        )

    async def client(self, request: Request) -> None:
        await self.admission.slot(request, set(), None)
        self.granted.append(request)

    async def take(self, band: str | None = None) -> Request:
        """A request of ``band`` that must get a slot at once."""
        request = self.request(band)
        await self.admission.slot(request, set(), None)
        assert request.holds_slot
        return request

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"service": "svc", **labels})
        return 0.0 if value is None else value


async def test_a_freed_slot_goes_to_the_highest_band_waiting_first_come_within_a_band():
    bench = Bench()
    holder = await bench.take("interactive")
    async with trio.open_nursery() as nursery:
        for band in ("batch", "standard", "batch", "interactive", "standard"):
            nursery.start_soon(bench.client, bench.request(band))
            await wait_all_tasks_blocked()
        assert bench.admission.queued("svc") == 5
        assert bench.admission.queued("svc", "batch") == 2
        order = []
        for _ in range(5):
            bench.admission.release(holder)
            await wait_all_tasks_blocked()
            holder = bench.granted[-1]
            order.append(holder.band.name)
    assert order == ["interactive", "standard", "standard", "batch", "batch"]
    assert bench.admission.queued("svc") == 0
    # Who joined behind whom: positions count the requests of its band and above.
    assert bench.sample("ficc_gateway_band_queue_position_sum", band="batch") == 1 + 3
    assert bench.sample("ficc_gateway_band_queue_position_sum", band="interactive") == 1
    assert bench.sample("ficc_gateway_band_waiting_requests", band="batch") == 0
    assert bench.sample("ficc_gateway_queued_requests") == 0
    assert bench.sample("ficc_gateway_band_granted_total", band="batch", via="priority") == 2
    assert bench.sample("ficc_gateway_band_granted_total", band="interactive", via="priority") == 1


async def test_a_band_waits_at_its_ceiling_even_with_a_slot_free_and_higher_bands_pass():
    bench = Bench(concurrency=4)  # 4 slots; batch (0.75) starts only while 3 or fewer are busy
    batch = [await bench.take("batch") for _ in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bench.client, bench.request("batch"))
        await wait_all_tasks_blocked()
        assert bench.admission.queued("svc", "batch") == 1
        assert bench.admission.load(bench.view.replicas[0].key) == 3  # a slot is free
        # A higher band is admitted directly into the headroom.
        interactive = await bench.take("interactive")
        assert bench.admission.load(bench.view.replicas[0].key) == 4
        # A batch slot frees: 3 busy, still at the ceiling, the batch request waits.
        bench.admission.release(batch[0])
        await wait_all_tasks_blocked()
        assert bench.granted == [] and bench.admission.queued("svc", "batch") == 1
        # The interactive one ends: 2 busy, below the ceiling: batch is served.
        bench.admission.release(interactive)
        await wait_all_tasks_blocked()
        assert [r.band.name for r in bench.granted] == ["batch"]


async def _constant_interactive_load(bench: Bench, grants: int) -> list[str]:
    """Keep two interactive requests and one batch request waiting at all times, free
    the one slot ``grants`` times; the bands the slot went to."""
    holder = await bench.take("interactive")
    served = []
    async with trio.open_nursery() as nursery:
        for _ in range(grants):
            while bench.admission.queued("svc", "interactive") < 2:
                nursery.start_soon(bench.client, bench.request("interactive"))
                await wait_all_tasks_blocked()
            if not bench.admission.queued("svc", "batch"):
                nursery.start_soon(bench.client, bench.request("batch"))
                await wait_all_tasks_blocked()
            bench.admission.release(holder)
            await wait_all_tasks_blocked()
            holder = bench.granted[-1]
            served.append(holder.band.name)
        nursery.cancel_scope.cancel()
    return served


@pytest.mark.deadline(7210)
async def test_a_batch_band_under_constant_interactive_load_still_gets_its_share(
    autojump_clock,
):
    bench = Bench(band_min_share="0.1")
    with trio.fail_after(3600):
        served = await _constant_interactive_load(bench, 200)
    # One grant in ten once its first credit is full (ten grants at a tenth each).
    assert [i for i, band in enumerate(served) if band == "batch"] == list(range(10, 200, 10))
    assert bench.sample("ficc_gateway_band_granted_total", band="batch", via="share") == 19
    assert bench.sample("ficc_gateway_band_granted_total", band="batch", via="priority") == 0
    # Without the minimum share priority is absolute, and batch starves.
    starved = Bench(band_min_share="0")
    with trio.fail_after(3600):
        assert "batch" not in await _constant_interactive_load(starved, 50)


async def test_the_minimum_share_lets_a_band_past_its_ceiling_when_it_is_owed_a_slot(
    autojump_clock,
):
    # 4 slots; batch's ceiling is 3 busy; interactive keeps every slot taken.
    bench = Bench(concurrency=4, band_min_share="0.25")
    holders = [await bench.take("interactive") for _ in range(4)]
    served = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bench.client, bench.request("batch"))
        for _ in range(8):
            while bench.admission.queued("svc", "interactive") < 2:
                nursery.start_soon(bench.client, bench.request("interactive"))
                await wait_all_tasks_blocked()
            bench.admission.release(holders.pop(0))
            await wait_all_tasks_blocked()
            holders.append(bench.granted[-1])
            served.append(bench.granted[-1].band.name)
        nursery.cancel_scope.cancel()
    assert served.count("batch") == 1
    assert served.index("batch") == 4  # owed after four grants at a quarter each


async def test_a_full_band_queue_is_refused_naming_the_band_and_other_bands_still_queue():
    bench = Bench(band_queue_capacity="2")
    await bench.take("interactive")
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(bench.client, bench.request("batch"))
            await wait_all_tasks_blocked()
        with pytest.raises(ServiceSaturated) as refused:
            await bench.admission.slot(bench.request("batch"), set(), None)
        assert refused.value.status == 429
        assert refused.value.headers["Retry-After"] == "1"
        assert refused.value.details["band"] == "batch"
        assert refused.value.details["band_queued"] == 2
        assert "band 'batch'" in refused.value.message
        # The interactive band's queue is its own.
        nursery.start_soon(bench.client, bench.request("interactive"))
        await wait_all_tasks_blocked()
        assert bench.admission.queued("svc", "interactive") == 1
        assert bench.admission.queued("svc") == 3
        nursery.cancel_scope.cancel()
    labels = {"band": "batch", "code": "service_saturated"}
    assert bench.sample("ficc_gateway_band_refusals_total", **labels) == 1
    # Those cancelled left their queues.
    assert bench.admission.queued("svc") == 0
    assert bench.sample("ficc_gateway_band_waiting_requests", band="batch") == 0


async def test_the_queue_also_holds_no_more_than_queue_factor_times_the_slots():
    bench = Bench(band_queue_capacity="64")
    bench.admission.queue_factor = 1
    await bench.take()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bench.client, bench.request())
        await wait_all_tasks_blocked()
        with pytest.raises(ServiceSaturated):
            await bench.admission.slot(bench.request(), set(), None)
        nursery.cancel_scope.cancel()


async def test_a_request_waits_no_longer_than_its_bands_queue_ttl_or_its_deadline(
    autojump_clock,
):
    bench = Bench(band_queue_ttl="5s")
    await bench.take("interactive")
    started = trio.current_time()
    with pytest.raises(NoReadyReplica) as refused:
        await bench.admission.slot(bench.request("batch"), set(), None)
    assert trio.current_time() - started == pytest.approx(5.0, abs=0.01)
    assert refused.value.status == 503
    assert refused.value.details["band"] == "batch"
    assert "waits at most 5 s" in refused.value.message
    # A request deadline shorter than the TTL ends the wait first.
    started = trio.current_time()
    with pytest.raises(NoReadyReplica):
        await bench.admission.slot(bench.request("batch", deadline=2.0), set(), None)
    assert trio.current_time() - started == pytest.approx(2.0, abs=0.01)
    labels = {"band": "batch", "code": "no_ready_replica"}
    assert bench.sample("ficc_gateway_band_refusals_total", **labels) == 2
    assert bench.admission.queued("svc") == 0


async def test_a_waiting_request_whose_credential_is_revoked_leaves_the_queue(autojump_clock):
    bench = Bench()
    await bench.take()
    waiting = bench.request()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def revoke_soon() -> None:
                await wait_all_tasks_blocked()
                bench.authority.mark_revoked(waiting.actor.id)

            nursery.start_soon(revoke_soon)
            with pytest.raises(FiccError) as refused:
                await bench.admission.slot(waiting, set(), None)
    assert refused.value.code == "credential_revoked"
    assert bench.admission.queued("svc") == 0


async def test_the_header_lowers_a_requests_band_and_an_unknown_one_is_refused():
    bench = Bench(concurrency=2)
    lowered = bench.request("standard", header="batch")
    await bench.admission.slot(lowered, set(), None)
    assert lowered.band.name == "batch"
    capped = bench.request("standard", header="interactive")
    await bench.admission.slot(capped, set(), None)
    assert capped.band.name == "standard"
    with pytest.raises(UnknownBand):
        await bench.admission.slot(bench.request(header="gold"), set(), None)


async def test_a_slot_handed_to_a_waiter_is_not_taken_by_a_newcomer():
    # The slot freed for the waiting standard request is its own before it runs: a
    # batch request arriving in between finds none free and queues.
    bench = Bench()
    holder = await bench.take()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bench.client, bench.request())
        await wait_all_tasks_blocked()
        bench.admission.release(holder)
        late = bench.request("batch")
        nursery.start_soon(bench.client, late)
        await wait_all_tasks_blocked()
        assert [r.band.name for r in bench.granted] == ["standard"]
        assert bench.admission.queued("svc", "batch") == 1
        nursery.cancel_scope.cancel()


def test_ficc_config_shows_the_bands_as_objects(tmp_path):
    from click.testing import CliRunner

    from ficc_core.cli.main import cli

    env = {"FICC_DATA_DIR": str(tmp_path), "FICC_BANDS": "live:9:1,bulk:1:0.5"}
    env["FICC_BAND_DEFAULT"] = "bulk"
    result = CliRunner().invoke(cli, ["config", "--json"], env=env)
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["bands"] == [
        {"name": "live", "priority": 9, "saturation_ceiling": 1.0},
        {"name": "bulk", "priority": 1, "saturation_ceiling": 0.5},
    ]
    assert (document["band_default"], document["band_min_share"]) == ("bulk", 0.1)
    refused = CliRunner().invoke(cli, ["config"], env={**env, "FICC_BANDS": "a:1:2"})
    assert refused.exit_code != 0
    assert "FICC_BANDS: bands: band 'a': the saturation_ceiling" in refused.output


async def test_slots_held_on_a_retiring_replica_do_not_count_against_the_ceiling():
    # A rollout's new generation is free while the previous one's requests finish: a
    # request starts there at once, whatever its band's ceiling.
    bench = Bench()
    await bench.take()
    successor = LiveReplica(index=0, node_id="n", fence=new_fence(2))
    bench.live.publish(
        attrs.evolve(bench.view, generation=2, replicas=(successor,), retiring=bench.view.replicas)
    )
    request = bench.request("batch")
    with trio.fail_after(5):
        await bench.admission.slot(request, set(), None)
    assert request.replica == successor
