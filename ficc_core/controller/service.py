"""The controller as one object: configuration, store, authentication, models, metrics.

The HTTP routes, the CLI and (later) federation transports all work through a
:class:`Service`; nothing reaches the store around it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..auth import AuthService
from ..auth.throttle import LoginThrottle
from ..config import Config
from ..contributors import NodeRegistry
from ..gateway import Gateway
from ..inference import InferenceManager, LiveTable, Reconciler
from ..metrics import Metrics
from ..models.acquire import Acquirer
from ..models.blobs import BlobStore
from ..models.fetch import FetchPolicy, make_client
from ..models.registry import ModelRegistry
from ..store import Store, open_sqlite_store

if TYPE_CHECKING:
    from ..models.hub import HubPreview


@attrs.define
class Service:
    """Everything a running controller holds."""

    config: Config
    store: Store
    auth: AuthService
    blobs: BlobStore
    models: ModelRegistry
    metrics: Metrics
    contributors: NodeRegistry
    #: Managed inference services; ``inference.gateway`` serves their invoke routes.
    inference: InferenceManager
    #: The routing view the reconciler publishes and the gateway reads.
    live: LiveTable

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
async def open_service(config: Config, *, background: bool = False) -> AsyncIterator[Service]:
    """Open the store (running migrations) and yield the :class:`Service`; close on exit.

    With ``background``, the controller's own tasks run too (acquisitions resume,
    node states follow heartbeats);
    ``ficc serve`` asks for them, one-shot admin commands do not.
    """
    store = await open_sqlite_store(config.database_path, readers=config.store_read_threads)
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
            login_throttle=LoginThrottle(
                max_failures=config.login_max_failures,
                lockout=config.login_lockout,
                on_lock=lambda limit: metrics.login_lockouts.labels(limit).inc(),
            ),
        )
        models = ModelRegistry(store, blobs, acquirer)
        contributors = NodeRegistry(
            store,
            unreachable_after=config.unreachable_after,
            lost_after=config.lost_after,
        )
        live = LiveTable()
        inference = InferenceManager(
            store=store,
            config=config,
            auth=auth,
            models=models,
            blobs=blobs,
            contributors=contributors,
            live=live,
        )
        inference.gateway = Gateway(
            live=live, contributors=contributors, auth=auth, metrics=metrics, config=config
        )
        inference.gateway.usage_sinks.append(inference.usage.record)
        service = Service(
            config=config,
            store=store,
            auth=auth,
            blobs=blobs,
            models=models,
            metrics=metrics,
            contributors=contributors,
            inference=inference,
            live=live,
        )
        if not background:
            yield service
            return
        async with trio.open_nursery() as nursery:
            await nursery.start(models.run)
            await nursery.start(acquirer.run)
            await nursery.start(service.contributors.run)
            inference.reconciler = Reconciler(inference)
            await nursery.start(inference.reconciler.run)
            await nursery.start(inference.usage.run)
            await nursery.start(auth.watch_revocations)
            yield service
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


__all__: list[Any] = ["Service", "open_service"]
