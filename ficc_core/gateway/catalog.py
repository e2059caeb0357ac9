"""The catalog: which service a model name reaches, and the ``/v1/models`` documents.

Everything here reads the :class:`~ficc_core.routing.live.LiveTable` (no store
read): a project's services are indexed by name once per change of the table
(its ``version``), so resolving a name is a dictionary lookup and a listing is
cached bytes.

A name reaches, among the services the credential may invoke (a service-bound
credential: its one service; a project credential: every service of its project):

1. the service whose alias it is (aliases are unique in a project);
2. else the services listing it among their ``names`` (the specification's
   ``aliases``, then the model's manifest name): the first, by alias, with a
   ready replica while it admits requests; else the first idle on-demand
   service (a request wakes it); else the first by alias.

A personal key reaches the services shared with its person, whatever their projects
(docs/people.md): aliases are unique only within a project, so where two shared
services answer to one alias or name, the earliest created wins, and ``/v1/models``
lists the one it hides by its service ID, which always reaches it. A fallback is
followed only within the first service's project, among the services shared.

A stopped or draining service still answers to its names (its fallbacks may
serve); ``/v1/models`` lists the services that are not stopped, draining ones
and idle on-demand ones (no replica running until a request wakes them)
included: a drain is the last step before a stop or a move, and while it lasts
the name still reaches the service (or its fallbacks).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import attrs

from ..base.strictjson import dumps
from .errors import ModelNotFound, shown_model

if TYPE_CHECKING:
    from ..auth import Principal
    from ..routing.live import LiveService, LiveTable

__all__ = ["CAPABILITIES", "Catalog", "model_entry", "models_document"]

#: The capabilities ``/v1/models`` reports for each model, true or false.
CAPABILITIES = ("chat", "embeddings", "tools", "vision", "completions")
#: Indexes of distinct shared sets kept between changes of the live table.
SHARED_INDEXES = 1024


def model_entry(view: LiveService, owner: str) -> dict[str, Any]:
    """The ``/v1/models`` entry of ``view``: OpenAI's fields, then what clients size
    requests by (``context_length``, ``max_output``) and what the model does."""
    return {
        "id": view.alias,
        "object": "model",
        "created": view.created,
        "owned_by": owner,
        "description": view.description,
        "context_length": view.context_length,
        "max_output": view.max_output,
        "capabilities": {name: name in view.capabilities for name in CAPABILITIES},
        "aliases": list(view.names),
    }


def models_document(views: Iterable[LiveService], owner: str) -> bytes:
    """The ``/v1/models`` answer listing ``views``, owned by ``owner``."""
    return dumps({"object": "list", "data": [model_entry(view, owner) for view in views]})


def _ready(view: LiveService) -> bool:
    return view.admission == "serving" and bool(view.replicas)


@attrs.define(eq=False)
class _Project:
    """One project's services by alias and by name, and its listing's bytes by owner."""

    by_alias: dict[str, LiveService]
    by_name: dict[str, list[LiveService]]
    listed: list[LiveService]
    documents: dict[str, bytes] = attrs.field(factory=dict)
    #: Services shared with a person: each by (project, alias), for fallbacks.
    by_project_alias: dict[tuple[str, str], LiveService] | None = None


def _index(views: Iterable[LiveService], *, shared: bool = False) -> _Project:
    """The index of one project's services, or (``shared``) of a person's shared ones:
    earliest created first, an alias another holds reached by the service's ID."""
    if shared:
        ordered = sorted(views, key=lambda view: (view.created, view.id))
    else:
        ordered = sorted(views, key=lambda view: view.alias)
    by_name: dict[str, list[LiveService]] = {}
    for view in ordered:
        for name in view.names:
            by_name.setdefault(name, []).append(view)
    by_alias: dict[str, LiveService] = {}
    for view in ordered:
        by_alias.setdefault(view.alias, view)
    if shared:
        for view in ordered:
            by_alias.setdefault(view.id, view)
    return _Project(
        by_alias=by_alias,
        by_name=by_name,
        listed=[view for view in ordered if view.admission != "stopped"],
        by_project_alias={(v.project_id, v.alias): v for v in ordered} if shared else None,
    )


def _shared_document(project: _Project) -> bytes:
    """The ``/v1/models`` answer of a person's shared services, each owned by its project
    and named by its alias, or by its ID where an earlier one holds the alias."""
    data = []
    for view in project.listed:
        entry = model_entry(view, view.project_id)
        if project.by_alias.get(view.alias) is not view:
            entry["id"] = view.id
        data.append(entry)
    return dumps({"object": "list", "data": data})


class Catalog:
    """Model names to services, and ``/v1/models``, for one credential (see the module).

    :param live: the live routing table.
    """

    def __init__(self, live: LiveTable) -> None:
        self.live = live
        self._version = -1
        self._projects: dict[str, _Project] = {}
        self._shared: dict[frozenset[str], _Project] = {}

    def _project(self, project_id: str) -> _Project:
        if self._version != self.live.version:
            self._projects.clear()
            self._shared.clear()
            self._version = self.live.version
        project = self._projects.get(project_id)
        if project is None:
            mine = (view for view in self.live.services() if view.project_id == project_id)
            project = self._projects[project_id] = _index(mine)
        return project

    def _index_of(self, actor: Principal) -> _Project:
        """The index of what ``actor`` may invoke: its project's, or for a personal key
        the services shared with its person."""
        if not actor.personal:
            return self._project(actor.project_id)
        self._project(actor.project_id)  # drops stale indexes
        project = self._shared.get(actor.shared)
        if project is None:
            if len(self._shared) >= SHARED_INDEXES:
                self._shared.clear()
            mine = (view for view in self.live.services() if view.id in actor.shared)
            project = self._shared[actor.shared] = _index(mine, shared=True)
        return project

    def _bound(self, actor: Principal) -> LiveService | None:
        """The one service a service-bound credential reaches, if it is published."""
        view = self.live.get(actor.service_id or "")
        return view if view is not None and view.project_id == actor.project_id else None

    def visible(self, actor: Principal) -> list[LiveService]:
        """The services ``actor`` may invoke and ``/v1/models`` lists, by alias."""
        if actor.service_id is not None:
            view = self._bound(actor)
            return [] if view is None or view.admission == "stopped" else [view]
        return self._index_of(actor).listed

    def listing(self, actor: Principal) -> bytes:
        """The project endpoint's ``/v1/models`` answer for ``actor``."""
        owner = actor.project_name or actor.project_id
        if actor.service_id is not None:
            return models_document(self.visible(actor), owner)
        project = self._index_of(actor)
        document = project.documents.get(owner)
        if document is None:
            if actor.personal:
                document = _shared_document(project)
            else:
                document = models_document(project.listed, owner)
            project.documents[owner] = document
        return document

    def entry(self, actor: Principal, model: str) -> bytes:
        """The project endpoint's ``/v1/models/{model}`` answer for ``actor``: the entry
        ``/v1/models`` lists for the service ``model`` reaches (:meth:`resolve`: its id,
        or another of its names); else raise :class:`ModelNotFound` (no service answers
        to it, or the one that does is stopped, so not listed)."""
        view = self.resolve(actor, model)
        if view.admission == "stopped":
            raise ModelNotFound(
                f"The model `{model}` is not available: its service `{view.alias}` is stopped",
                details={"model": model, "service": view.alias},
            )
        if actor.service_id is not None or not actor.personal:
            return dumps(model_entry(view, actor.project_name or actor.project_id))
        # A person's shared service, as :func:`_shared_document` lists it.
        entry = model_entry(view, view.project_id)
        if self._index_of(actor).by_alias.get(view.alias) is not view:
            entry["id"] = view.id
        return dumps(entry)

    def resolve(self, actor: Principal, model: str) -> LiveService:
        """The service ``model`` names for ``actor`` (see the module); else raise
        :class:`ModelNotFound` with the names ``actor`` may use."""
        if actor.service_id is not None:
            view = self._bound(actor)
            if view is not None and (model == view.alias or model in view.names):
                return view
            return self._unknown(model, [] if view is None else [view])
        project = self._index_of(actor)
        view = project.by_alias.get(model)
        if view is not None:
            return view
        named = project.by_name.get(model)
        if named:
            return next(
                (view for view in named if _ready(view)),
                next((view for view in named if view.wakes), named[0]),
            )
        return self._unknown(model, project.by_alias.values())

    def fallbacks(self, actor: Principal, view: LiveService) -> list[LiveService]:
        """``view``'s fallbacks ``actor`` may invoke, in order, by alias (a fallback's own
        fallbacks are not followed; a service-bound credential has none: a fallback is
        another service)."""
        if actor.service_id is not None or not view.fallbacks:
            return []
        project = self._index_of(actor)
        if project.by_project_alias is not None:
            shared = project.by_project_alias
            keys = [(view.project_id, alias) for alias in view.fallbacks]
            return [shared[key] for key in keys if key in shared]
        by_alias = project.by_alias
        return [by_alias[alias] for alias in view.fallbacks if alias in by_alias]

    @staticmethod
    def _unknown(model: str, views: Iterable[LiveService]) -> NoReturn:
        names = list(dict.fromkeys(name for view in views for name in (view.alias, *view.names)))
        shown = shown_model(model)
        raise ModelNotFound(
            f"The model `{shown}` does not exist: this credential may use "
            f"{', '.join(f'`{name}`' for name in names) or 'no model'}",
            details={"model": shown, "available": sorted(set(names))},
        )
