"""The directory: projects, users and their memberships (scopes per project)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import trio

from ..base.errors import Conflict, InvalidRequest, NotFound
from ..routing.bands import BandTable
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .records import Project, User, UserStatus
from .scopes import ADMIN, check_scopes


def check_password(password: str) -> None:
    """Refuse a password too short to keep (the one rule for every password set)."""
    if len(password) < 8:
        raise InvalidRequest(
            "a password needs at least 8 characters",
            details={"errors": [{"path": "$.password", "message": "too short"}]},
        )


def _require_user(tx: Transaction, user_id: str) -> User:
    user = repository.find_user(tx, user_id)
    if user is None:
        raise NotFound(f"no user {user_id!r}", code="user_not_found")
    return user


class Directory:
    """Projects and users, through the :class:`Store`."""

    def __init__(
        self,
        store: Store,
        *,
        password_limiter: trio.CapacityLimiter,
        clock: Callable[[], float],
        bands: BandTable,
    ) -> None:
        self.store = store
        self._password_limiter = password_limiter
        self.clock = clock
        self.bands = bands

    async def create_project(self, name: str) -> Project:
        """Create a project; a taken name is a conflict."""
        project = Project(id=sec.new_id(), name=name, created_at=self.clock())

        def insert(tx: Transaction) -> Project:
            if repository.project_name_taken(tx, name):
                raise Conflict(
                    f"a project named {name!r} already exists",
                    code="project_exists",
                    details={"name": name},
                )
            repository.insert_project(tx, project)
            return project

        return await self.store.write(insert)

    async def list_projects(self) -> list[Project]:
        """Every project, oldest first."""
        return await self.store.read(repository.list_projects)

    async def get_project(self, ref: str) -> Project:
        """A project by id or name."""
        return await self.store.read(partial(repository.require_project, ref=ref))

    async def set_project_band(self, ref: str, band: str | None) -> Project:
        """Set the project's priority band (one of the configured bands; None clears it).

        Credentials already verified keep the band they were read with for the
        authority's cache period (5 s), as a revocation by another process does.
        """
        if band is not None:
            self.bands.require(band)

        def write(tx: Transaction) -> Project:
            project = repository.require_project(tx, ref)
            repository.set_project_band(tx, project.id, band)
            return repository.require_project(tx, project.id)

        return await self.store.write(write)

    async def create_user(
        self,
        username: str,
        password: str,
        *,
        admin: bool = False,
        projects: Mapping[str, frozenset[str]] | None = None,
        status: UserStatus = UserStatus.ACTIVE,
    ) -> User:
        """Create a user with an argon2 password hash and project memberships."""
        check_password(password)
        grants = {ref: check_scopes(scopes) - {ADMIN} for ref, scopes in (projects or {}).items()}
        password_hash = await sec.hash_password(password, self._password_limiter)
        user_id, now = sec.new_id(), self.clock()

        def insert(tx: Transaction) -> User:
            if repository.username_taken(tx, username):
                raise Conflict(
                    f"a user named {username!r} already exists",
                    code="user_exists",
                    details={"username": username},
                )
            repository.insert_user(
                tx, user_id, username, password_hash, is_admin=admin, created_at=now, status=status
            )
            for ref, scopes in grants.items():
                project = repository.require_project(tx, ref)
                repository.insert_membership(tx, user_id, project.id, scopes)
            return _require_user(tx, user_id)

        return await self.store.write(insert)

    async def list_users(self) -> list[User]:
        """Every user with their memberships (never a password hash)."""
        return await self.store.read(repository.list_users)

    async def set_membership(self, user_id: str, project_ref: str, scopes: frozenset[str]) -> User:
        """Set a user's scopes in a project (an empty set removes the membership)."""
        scopes = check_scopes(scopes) - {ADMIN}

        def write(tx: Transaction) -> User:
            _require_user(tx, user_id)
            project = repository.require_project(tx, project_ref)
            repository.delete_membership(tx, user_id, project.id)
            if scopes:
                repository.insert_membership(tx, user_id, project.id, scopes)
            return _require_user(tx, user_id)

        return await self.store.write(write)

    async def has_users(self) -> bool:
        """Whether any user exists (first-run bootstrap checks this)."""
        return await self.store.read(repository.has_users)
