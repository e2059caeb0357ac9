"""The controller as one object, assembled in one function: :func:`open_service`.

Every component is built once, there, with its collaborators passed to its
constructor; the HTTP routes, the CLI and the embedded agent all work through the
:class:`Service` it yields, and nothing reaches the store around it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..auth import AuthService
from ..auth.throttle import LoginThrottle
from ..bands import BandTable
from ..config import Config
from ..contributors import NodeRegistry
from ..events import EventRetention
from ..gateway import Gateway
from ..inference import InferenceManager, LiveTable, ModelContexts, Reconciler, UsageLedger
from ..inference.autoscaler import Autoscaler
from ..inference.moves import Mover
from ..inference.rollout import Restarter
from ..metrics import Metrics
from ..models.acquire import Acquirer
from ..models.blobs import BlobStore
from ..models.fetch import FetchPolicy, make_client
from ..models.registry import ModelRegistry
from ..plugins import PluginSet, build_plugin_manager
from ..quotas import Quotas, QuotaSync
from ..store import Store, open_store

if TYPE_CHECKING:
    from ..models.hub import HubPreview


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
    #: Every invoke request's usage, written in batches.
    usage: UsageLedger
    #: Rate limits, budgets and spend (the gateway's quota gate; docs/limits.md).
    quotas: Quotas
    #: Shares the gate's counts with the other processes on the store.
    quota_sync: QuotaSync

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


@asynccontextmanager
async def open_service(
    config: Config,
    *,
    background: bool = False,
    plugins: PluginSet | None = None,
    gateway_options: Mapping[str, Any] | None = None,
) -> AsyncIterator[Service]:
    """Open the store (running migrations) and yield the :class:`Service`; close on exit.

    With ``background``, the controller's own tasks run too (acquisitions resume,
    node states follow heartbeats, the reconciler drives the services, usage is
    written); ``ficc serve`` asks for them, one-shot admin commands do not.

    :param plugins: the plugin set to use (by default the installed plugins are loaded,
        once for the process).
    :param gateway_options: the gateway's tuning (queue bounds, attempts, send grace),
        as :class:`~ficc_core.gateway.Gateway` keywords; tests narrow them.
    """
    if plugins is None:
        plugins = await trio.to_thread.run_sync(build_plugin_manager)
    store = await open_store(config)
    try:
        blobs = await trio.to_thread.run_sync(BlobStore, config.blobs_path, store)
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
        models = ModelRegistry(store, blobs, acquirer)
        contributors = NodeRegistry(
            store,
            unreachable_after=config.unreachable_after,
            lost_after=config.lost_after,
            heartbeat_interval=config.heartbeat_interval,
            # The reconciler is built with the registry, so it is named when called.
            notify=lambda node_id: reconciler.node_changed(node_id),
        )
        live = LiveTable()
        contexts = ModelContexts(models=models, blobs=blobs)
        usage = UsageLedger(
            store,
            period=config.usage_flush_interval,
            batch_size=config.usage_batch_size,
            capacity=config.usage_buffer_size,
            metrics=metrics,
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
        )
        gateway = Gateway(
            live=live,
            contributors=contributors,
            auth=auth,
            metrics=metrics,
            config=config,
            usage_sinks=[usage.record],
            quotas=quotas,
            **(gateway_options or {}),
        )
        # A retiring attempt (a move's source, a rollout's previous generation) drains
        # until the gateway has no request in flight on it.
        reconciler.replica_idle = gateway.admission.wait_idle
        inference = InferenceManager(
            store=store,
            auth=auth,
            adapters=plugins.adapters,
            contexts=contexts,
            live=live,
            usage=usage,
            gateway=gateway,
            drain_timeout=config.drain_timeout,
            notify=reconciler.wake,
        )
        inference.mover = Mover(
            reconciler=reconciler, contexts=contexts, ready_timeout=config.replica_ready_timeout
        )
        inference.restarter = Restarter(
            reconciler=reconciler, ready_timeout=config.replica_ready_timeout
        )
        # Idle on-demand services wake on a request; scaled ones follow the gateway's demand.
        autoscaler = inference.autoscaler = Autoscaler(
            store=store,
            reconciler=reconciler,
            contexts=contexts,
            live=live,
            config=config,
            metrics=metrics,
        )
        gateway.activate = autoscaler.activate
        autoscaler.demand = gateway.demand
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
            usage=usage,
            quotas=quotas,
            quota_sync=quota_sync,
        )
        if not background:
            yield service
            return
        async with trio.open_nursery() as nursery:
            await nursery.start(models.run)
            await nursery.start(acquirer.run)
            await nursery.start(contributors.run)
            await nursery.start(reconciler.run)
            await nursery.start(autoscaler.run)
            await nursery.start(usage.run)
            await nursery.start(auth.watch_revocations)
            await nursery.start(gateway.run)
            await nursery.start(quota_sync.run)
            await nursery.start(
                EventRetention(
                    store,
                    retention=config.events_retention,
                    max_per_service=config.events_max_per_service,
                ).run
            )
            yield service
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


__all__: list[Any] = ["Service", "open_service"]
