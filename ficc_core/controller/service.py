"""The controller as one object, assembled in one function: :func:`open_service`.

Every component is built once, there, with its collaborators passed to its
constructor; the HTTP routes, the CLI and the embedded agent all work through the
:class:`Service` it yields, and nothing reaches the store around it.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..auth import AuthService
from ..auth.throttle import LoginThrottle
from ..config import Config
from ..contributors import NodeRegistry
from ..events import EventRetention
from ..gateway import Gateway, ProjectEndpoint
from ..inference import InferenceManager, ModelContexts, Reconciler
from ..inference.operations.moves import Mover
from ..inference.operations.rollout import Restarter
from ..inference.reconciliation.state_metrics import StateMetrics
from ..inference.scaling.autoscaler import Autoscaler
from ..models.acquire import Acquirer
from ..models.blobs import BlobStore
from ..models.fetch import FetchPolicy, make_client
from ..models.registry import ModelRegistry
from ..plugins import PluginSet, build_plugin_manager
from ..quotas import Quotas, QuotaSync
from ..routing.activation import ActivationChannel
from ..routing.bands import BandTable
from ..routing.demand import DemandBoard
from ..routing.idle import IdleSignal
from ..routing.live import LiveTable
from ..store import Store, open_store
from ..usage import UsageLedger, UsageSpool
from ..usage.spool import FOLDER as SPOOL_FOLDER
from .follower import RoutingFollower
from .lease import LeaderLease
from .metrics import Metrics

if TYPE_CHECKING:
    from ..models.hub import HubPreview

log = logging.getLogger("ficc.controller")


@attrs.define
class Service:
    """Everything a running controller holds."""

    config: Config
    store: Store
    #: The process's one plugin set: the engine adapters and the executor providers.
    plugins: PluginSet
    auth: AuthService
    blobs: BlobStore
    models: ModelRegistry
    metrics: Metrics
    contributors: NodeRegistry
    #: Managed inference services (what operators ask).
    inference: InferenceManager
    #: Drives the services' attempts (running only with ``background``).
    reconciler: Reconciler
    #: The routing view the reconciler publishes and the gateway reads.
    live: LiveTable
    #: Serves the services' invoke routes.
    gateway: Gateway
    #: Serves the project endpoint's routes (a model's name to a service, fallbacks)
    #: through the gateway.
    project: ProjectEndpoint
    #: Every invoke request's usage, written in batches.
    usage: UsageLedger
    #: Rate limits, budgets and spend (the gateway's quota gate; docs/limits.md).
    quotas: Quotas
    #: Shares the gate's counts with the other processes on the store.
    quota_sync: QuotaSync
    #: Whether this controller leads the ones sharing the store (and its term).
    lease: LeaderLease

    @property
    def fetch_policy(self) -> FetchPolicy:
        """What outbound HTTPS requests may do."""
        return FetchPolicy.from_config(self.config)

    async def hub_preview(
        self, repository: str, revision: str, *, filename: str | None, licence: str | None
    ) -> list[HubPreview]:
        """Resolve a public hub repository's GGUF files into manifests, reading headers only."""
        from ..models.hub import hub_preview

        policy = self.fetch_policy
        async with make_client(policy) as client:
            return await hub_preview(
                client,
                policy,
                self.config.hub_url,
                repository,
                revision,
                filename=filename,
                licence=licence,
            )


def controller_id(config: Config) -> str:
    """This controller's name: ``controller_id``, else the hostname and port (with port
    0, a random suffix: two such controllers on one machine must not share a name)."""
    if config.controller_id:
        return config.controller_id
    suffix = f"-{secrets.token_hex(3)}" if config.port == 0 else ""
    return f"{socket.gethostname()}:{config.port}{suffix}"


def advertise_url(config: Config) -> str:
    """The URL others reach this controller on: ``advertise_url``, else the listener's."""
    if config.advertise_url:
        return config.advertise_url
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"{'https' if config.tls else 'http'}://{host}:{config.port}"


async def _open_usage_spool(config: Config, owner: str) -> UsageSpool | None:
    """The usage writer's spool in the data directory (docs/usage.md, "Accounting");
    without one (None), usage is in memory until written, as before."""
    spool = UsageSpool(config.data_dir / SPOOL_FOLDER, owner)
    try:
        await trio.to_thread.run_sync(spool.open)
    except OSError as exc:
        log.warning("no usage spool (%s): a killed controller loses its unwritten usage", exc)
        return None
    return spool


@asynccontextmanager
async def open_service(
    config: Config,
    *,
    background: bool = False,
    plugins: PluginSet | None = None,
    gateway_options: Mapping[str, Any] | None = None,
) -> AsyncIterator[Service]:
    """Open the store (running migrations) and yield the :class:`Service`; close on exit.

    With ``background``, the controller's own tasks run too; ``ficc serve`` asks for
    them, one-shot admin commands do not. Every controller writes usage, shares quota
    counts, watches revocations and runs the gateway's tasks. The leader lease decides
    the rest (docs/operations.md, "Several controllers"): the leader resumes
    acquisitions, sweeps node states, runs the reconciler (which adopts what the store
    says runs), the autoscaler and event retention; a standby follows the store into
    its routing table instead. Losing the lease cancels the leader's work (no replica
    is stopped); taking it starts that work.

    :param plugins: the plugin set to use (by default the installed plugins are loaded,
        once for the process).
    :param gateway_options: the gateway's tuning (queue bounds, attempts, send grace),
        as :class:`~ficc_core.gateway.Gateway` keywords; tests narrow them.
    """
    if plugins is None:
        plugins = await trio.to_thread.run_sync(build_plugin_manager)
    store = await open_store(config)
    try:
        blobs = await trio.to_thread.run_sync(
            lambda: BlobStore(config.blobs_path, store, reserve=config.storage_reserve)
        )
        acquirer = Acquirer(
            store,
            blobs,
            FetchPolicy.from_config(config),
            concurrency=config.acquisition_concurrency,
            retries=config.acquisition_retries,
        )
        metrics = Metrics()
        auth = AuthService(
            store,
            session_lifetime=config.session_lifetime,
            token_max_lifetime=config.token_max_lifetime,
            credential_cache_seconds=config.auth_cache_ttl,
            rejected_cache_seconds=config.auth_negative_ttl,
            login_throttle=LoginThrottle(
                max_failures=config.login_max_failures,
                lockout=config.login_lockout,
                on_lock=lambda limit: metrics.login_lockouts.labels(limit).inc(),
            ),
            bands=BandTable(config.bands, config.band_default),
            signup_open=config.signup_open,
            signup_throttle=LoginThrottle(
                max_failures=config.login_max_failures, lockout=config.login_lockout
            ),
            personal_disabled=config.personal_disabled,
        )
        models = ModelRegistry(store, blobs, acquirer, tidy_after=config.partial_tidy_after)
        # The role's work is named when the lease runs it (after everything is built).
        lease = LeaderLease(
            store,
            controller_id=controller_id(config),
            url=advertise_url(config),
            duration=config.leader_lease,
            renew_interval=config.leader_renew_interval,
            lead=lambda term, task_status: lead(term, task_status=task_status),
            follow=lambda task_status: follow(task_status=task_status),
        )
        # Read at scrape time: which controller leads, at which term (docs/monitoring.md).
        metrics.controller_leader.labels(lease.controller_id).set_function(
            lambda: 1.0 if lease.leading else 0.0
        )
        metrics.controller_term.labels(lease.controller_id).set_function(lambda: lease.term)
        contributors = NodeRegistry(
            store,
            unreachable_after=config.unreachable_after,
            lost_after=config.lost_after,
            heartbeat_interval=config.heartbeat_interval,
            # The reconciler is built with the registry, so it is named when called.
            notify=lambda node_id: reconciler.node_changed(node_id),
            leadership=lease,
            controller_id=lease.controller_id,
        )
        # The seams between the gateway and inference (ficc_core.routing): the gateway
        # reads the table and serves the board and the idle signal; the reconciler
        # publishes to the table and waits on the signal; the autoscaler reads the board
        # and serves the activation channel, which the gateway calls.
        live = LiveTable()
        board = DemandBoard()
        idle_signal = IdleSignal()
        activations = ActivationChannel()
        contexts = ModelContexts(models=models, blobs=blobs)
        # Only a controller that runs its tasks spools usage (and replays others' spools).
        spool = await _open_usage_spool(config, lease.controller_id) if background else None
        usage = UsageLedger(
            store,
            period=config.usage_flush_interval,
            batch_size=config.usage_batch_size,
            capacity=config.usage_buffer_size,
            metrics=metrics,
            spool=spool,
        )
        quotas = Quotas(store, config)
        await quotas.load()
        quota_sync = QuotaSync(quotas, metrics, interval=config.limits_sync_interval)
        reconciler = Reconciler(
            store=store,
            contributors=contributors,
            live=live,
            adapters=plugins.adapters,
            contexts=contexts,
            blobs=blobs,
            retry_max=config.replica_retry_max,
            give_up_after=config.replica_give_up_after,
            drain_timeout=config.drain_timeout,
            activation_retry=config.activation_retry,
            follow_interval=config.follow_interval,
            liveness={
                "interval": config.liveness_interval,
                "timeout": config.liveness_timeout,
                "misses": config.liveness_misses,
            },
            metrics=metrics,
            scaling_metrics=metrics,
            idle_signal=idle_signal,
        )
        follower = RoutingFollower(
            store,
            live=live,
            contributors=contributors,
            reconciler=reconciler,
            interval=config.follow_interval,
        )
        gateway = Gateway(
            live=live,
            contributors=contributors,
            auth=auth,
            metrics=metrics,
            config=config,
            usage_sinks=[usage.record],
            quotas=quotas,
            activations=activations,
            board=board,
            idle_signal=idle_signal,
            **(gateway_options or {}),
        )
        project = ProjectEndpoint(gateway)
        # Idle on-demand services wake on a request; scaled ones follow the gateway's demand.
        autoscaler = Autoscaler(
            store=store,
            reconciler=reconciler,
            contexts=contexts,
            live=live,
            config=config,
            metrics=metrics,
            activations=activations,
            board=board,
        )
        inference = InferenceManager(
            store=store,
            auth=auth,
            adapters=plugins.adapters,
            contexts=contexts,
            live=live,
            usage=usage,
            gateway=gateway,
            mover=Mover(
                reconciler=reconciler,
                contexts=contexts,
                ready_timeout=config.replica_ready_timeout,
            ),
            restarter=Restarter(reconciler=reconciler, ready_timeout=config.replica_ready_timeout),
            autoscaler=autoscaler,
            drain_timeout=config.drain_timeout,
            notify=reconciler.wake,
        )
        service = Service(
            config=config,
            store=store,
            plugins=plugins,
            auth=auth,
            blobs=blobs,
            models=models,
            metrics=metrics,
            contributors=contributors,
            inference=inference,
            reconciler=reconciler,
            live=live,
            gateway=gateway,
            project=project,
            usage=usage,
            quotas=quotas,
            quota_sync=quota_sync,
            lease=lease,
        )
        if not background:
            yield service
            return
        if spool is not None:
            # Killed controllers' spools, before this one's tasks start.
            await usage.replay()

        async def lead(_term: int, *, task_status: trio.TaskStatus[None]) -> None:
            """The leader's work, cancelled when it loses the lease (nothing it runs stops)."""
            async with trio.open_nursery() as leading:
                await leading.start(models.run)
                await leading.start(acquirer.run)
                await leading.start(contributors.run)
                await leading.start(reconciler.run)
                await leading.start(autoscaler.run)
                await leading.start(
                    EventRetention(
                        store,
                        retention=config.events_retention,
                        max_per_service=config.events_max_per_service,
                    ).run
                )
                # A controller of this data directory killed while leading: its usage.
                leading.start_soon(usage.replay)
                task_status.started()

        async def follow(*, task_status: trio.TaskStatus[None]) -> None:
            """A standby's work: its routing table follows the store, and a request to an
            idle on-demand service records the wake-up for the leader to carry out."""
            async with trio.open_nursery() as following:
                await following.start(follower.run)
                await following.start(
                    lambda task_status: autoscaler.run(decide=False, task_status=task_status)
                )
                task_status.started()

        if config.lease_duration <= config.leader_lease + config.leader_renew_interval:
            log.warning(
                "lease_duration (%g s) is not longer than leader_lease + leader_renew_interval "
                "(%g s): with several controllers, agents may stop their attempts while a "
                "standby takes over",
                config.lease_duration,
                config.leader_lease + config.leader_renew_interval,
            )
        async with trio.open_nursery() as nursery:
            await nursery.start(usage.run)
            await nursery.start(auth.watch_revocations)
            await nursery.start(gateway.run)
            await nursery.start(quota_sync.run)
            await nursery.start(
                StateMetrics(
                    store=store,
                    contributors=contributors,
                    metrics=metrics,
                    interval=config.metrics_state_interval,
                ).run
            )
            await nursery.start(lease.run)
            yield service
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


__all__: list[Any] = ["Service", "open_service"]
