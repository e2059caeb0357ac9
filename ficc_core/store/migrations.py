"""Schema migrations, applied in order on start; the version records the last applied.

SQLite keeps the version in ``PRAGMA user_version``, PostgreSQL in ``ficc_schema``.
Append a new tuple of statements for every change; never edit a released one. One list
serves both backends: PostgreSQL runs each statement with its types translated
(:func:`ficc_core.store.dialect.translate_ddl`); a statement SQLite alone understands
(its JSON functions, ``rowid``, ``ifnull``) is a :class:`Dialects` pair, with a
PostgreSQL form of the same meaning beside it.

Migrations are expand-then-contract, so controllers of adjacent versions share one
database during a rolling upgrade (docs/operations.md, "Upgrading a fleet"):

- an **expand** migration only adds (a table, a column that is nullable or has a
  default, an index) or rewrites data an older FICC reads the same way; it is listed
  in :data:`EXPANDS`, and a FICC that knows the version before it keeps working on a
  database it migrated;
- a **contract** migration (dropping or renaming what an older FICC still uses, a
  column made required) goes in a later release than the expand it follows, once no
  controller of the release before the expand runs; it is not listed.

On PostgreSQL ``ficc_schema`` records, beside ``version``, ``compatible_from``: the
oldest schema version whose FICC runs on the database (:func:`compatible_from`). A
controller finding a newer version starts on it when its own newest reaches that
(:func:`check_newer`), and refuses otherwise. A SQLite data directory has one
controller, and refuses any newer version.
"""

from __future__ import annotations

from typing import NamedTuple

from ..base.errors import StoreError


class Dialects(NamedTuple):
    """One migration statement written once per backend (the same meaning in each)."""

    sqlite: str
    postgresql: str


def statements(version: int, backend: str) -> tuple[str, ...]:
    """Migration ``version``'s statements (1-based) in ``backend``'s form ("sqlite" or
    "postgresql")."""
    return tuple(
        getattr(statement, backend) if isinstance(statement, Dialects) else statement
        for statement in MIGRATIONS[version - 1]
    )


MIGRATIONS: list[tuple[str | Dialects, ...]] = [
    # 1: projects, users, memberships, bearer credentials, browser sessions.
    (
        """CREATE TABLE projects (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL
        )""",
        """CREATE TABLE users (
            id TEXT PRIMARY KEY,
            username TEXT NOT NULL UNIQUE,
            password_hash TEXT NOT NULL,
            is_admin INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        )""",
        """CREATE TABLE memberships (
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            scopes TEXT NOT NULL,
            PRIMARY KEY (user_id, project_id)
        )""",
        """CREATE TABLE credentials (
            id TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            user_id TEXT REFERENCES users(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            scopes TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL,
            revoked_at REAL
        )""",
        "CREATE INDEX credentials_project ON credentials(project_id)",
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL,
            csrf_hash TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL
        )""",
    ),
    # 2: the model registry: manifests, their files, shared blobs, acquisitions.
    (
        """CREATE TABLE models (
            id TEXT PRIMARY KEY,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            manifest TEXT NOT NULL,
            digest TEXT NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (project_id, name)
        )""",
        """CREATE TABLE model_files (
            model_id TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            path TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            url TEXT,
            PRIMARY KEY (model_id, idx)
        )""",
        "CREATE INDEX model_files_sha256 ON model_files(sha256)",
        """CREATE TABLE blobs (
            sha256 TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            state TEXT NOT NULL,
            durable_offset INTEGER NOT NULL DEFAULT 0,
            reason TEXT,
            updated_at REAL NOT NULL
        )""",
        """CREATE TABLE acquisitions (
            model_id TEXT PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
            state TEXT NOT NULL,
            reason TEXT,
            updated_at REAL NOT NULL
        )""",
    ),
    # 3: contributor nodes (each with its own node credential) and the attempts they report.
    (
        """CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            labels TEXT NOT NULL DEFAULT '{}',
            credential_id TEXT NOT NULL UNIQUE,
            secret_hash TEXT NOT NULL,
            state TEXT NOT NULL,
            connection_id TEXT,
            last_heartbeat REAL,
            snapshot TEXT,
            created_at REAL NOT NULL,
            revoked_at REAL
        )""",
        """CREATE TABLE node_attempts (
            node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            attempt_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            plan_digest TEXT NOT NULL,
            provider TEXT NOT NULL,
            state TEXT NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (node_id, attempt_id)
        )""",
    ),
    # 4: what the controller asked each node to run and whether it still wants it
    # (reconciled against what a reconnecting agent reports).
    (
        """CREATE TABLE node_assignments (
            node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            attempt_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            plan_digest TEXT NOT NULL,
            provider TEXT NOT NULL,
            wanted INTEGER NOT NULL,
            reason TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (node_id, attempt_id)
        )""",
    ),
    # 5: inference services, their replicas' attempts and reservations; invoke credentials
    # bound to one service.
    (
        """CREATE TABLE inference_services (
            id TEXT PRIMARY KEY,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            alias TEXT NOT NULL,
            model_id TEXT NOT NULL,
            spec TEXT NOT NULL,
            revision INTEGER NOT NULL,
            generation INTEGER NOT NULL,
            desired TEXT NOT NULL,
            state TEXT NOT NULL,
            reason TEXT,
            plan_digest TEXT,
            drain_deadline REAL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            UNIQUE (project_id, alias)
        )""",
        "CREATE INDEX inference_services_model ON inference_services(model_id)",
        """CREATE TABLE inference_attempts (
            attempt_id TEXT PRIMARY KEY,
            service_id TEXT NOT NULL REFERENCES inference_services(id) ON DELETE CASCADE,
            replica INTEGER NOT NULL,
            generation INTEGER NOT NULL,
            number INTEGER NOT NULL,
            node_id TEXT NOT NULL,
            provider TEXT NOT NULL,
            plan_digest TEXT,
            workload TEXT,
            state TEXT NOT NULL,
            reason TEXT,
            message TEXT,
            released INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX inference_attempts_service ON inference_attempts(service_id, replica)",
        """CREATE TABLE inference_reservations (
            service_id TEXT NOT NULL REFERENCES inference_services(id) ON DELETE CASCADE,
            replica INTEGER NOT NULL,
            node_id TEXT NOT NULL,
            cpus REAL NOT NULL,
            memory_bytes INTEGER NOT NULL,
            disk_bytes INTEGER NOT NULL,
            gpus TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (service_id, replica)
        )""",
        "CREATE INDEX inference_reservations_node ON inference_reservations(node_id)",
        "ALTER TABLE credentials ADD COLUMN service_id TEXT",
    ),
    # 6: what each invoke request used (tokens, latency), written in batches off the
    # request path.
    (
        """CREATE TABLE inference_usage (
            id INTEGER PRIMARY KEY,
            service_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            replica TEXT NOT NULL,
            node_id TEXT NOT NULL,
            credential_id TEXT NOT NULL,
            path TEXT NOT NULL,
            status INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            queue_wait REAL NOT NULL,
            ttfb REAL,
            duration REAL NOT NULL,
            finished_at REAL NOT NULL
        )""",
        "CREATE INDEX inference_usage_service ON inference_usage(service_id, finished_at)",
    ),
    # 7: the blob digests each assignment told its node to stage (a JSON array of hex
    # digests): a node credential downloads those, and only while the attempt is wanted.
    ("ALTER TABLE node_assignments ADD COLUMN inputs TEXT NOT NULL DEFAULT '[]'",),
    # 8: who minted each credential (a credential or a session id; NULL for the CLI and
    # the first run), so revoking an issuer revokes what it minted.
    (
        "ALTER TABLE credentials ADD COLUMN issuer_id TEXT",
        "CREATE INDEX credentials_issuer ON credentials(issuer_id)",
    ),
    # 9: a partial file belongs to the model file that fills it (uploads and acquisitions
    # of one model never touch another's progress); a blob row now only says whether the
    # content is verified. Progress held before this moves to the earliest model that
    # references its content (the controller renames the file on start). Failures keep
    # their code and details (JSON) beside the text.
    (
        """CREATE TABLE partials (
            model_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            size INTEGER NOT NULL,
            state TEXT NOT NULL,
            durable_offset INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (model_id, idx),
            FOREIGN KEY (model_id, idx) REFERENCES model_files(model_id, idx) ON DELETE CASCADE
        )""",
        "CREATE INDEX partials_sha256 ON partials(sha256)",
        Dialects(
            sqlite="""INSERT INTO partials (model_id, idx, sha256, size, state, durable_offset,
            error, updated_at)
        SELECT f.model_id, f.idx, b.sha256, b.size, b.state, b.durable_offset,
            CASE WHEN b.reason IS NULL THEN NULL ELSE json_object('code', 'upload_failed',
                'message', b.reason, 'details', json_object()) END,
            b.updated_at
        FROM blobs b JOIN model_files f ON f.sha256 = b.sha256
        WHERE b.state != 'verified' AND (b.durable_offset > 0 OR b.state != 'partial')
            AND f.rowid = (SELECT f2.rowid FROM model_files f2 JOIN models m ON m.id = f2.model_id
                WHERE f2.sha256 = b.sha256 ORDER BY m.created_at, f2.model_id, f2.idx LIMIT 1)""",
            # The same, with PostgreSQL's JSON builder and the file's key for SQLite's rowid.
            postgresql="""INSERT INTO partials (model_id, idx, sha256, size, state,
            durable_offset, error, updated_at)
        SELECT f.model_id, f.idx, b.sha256, b.size, b.state, b.durable_offset,
            CASE WHEN b.reason IS NULL THEN NULL ELSE json_build_object('code',
                'upload_failed', 'message', b.reason, 'details', json_build_object())::text END,
            b.updated_at
        FROM blobs b JOIN model_files f ON f.sha256 = b.sha256
        WHERE b.state != 'verified' AND (b.durable_offset > 0 OR b.state != 'partial')
            AND (f.model_id, f.idx) = (SELECT f2.model_id, f2.idx FROM model_files f2
                JOIN models m ON m.id = f2.model_id
                WHERE f2.sha256 = b.sha256 ORDER BY m.created_at, f2.model_id, f2.idx LIMIT 1)""",
        ),
        "UPDATE blobs SET state = 'partial', durable_offset = 0, reason = NULL"
        " WHERE state != 'verified'",
        "ALTER TABLE acquisitions ADD COLUMN error TEXT",
    ),
    # 10: events: every state change of a service, replica, attempt and node, written in
    # the transaction of its change. AUTOINCREMENT: an ID is never reused after a prune,
    # so a reader's `after` cursor never skips an event.
    (
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            subject TEXT NOT NULL,
            subject_id TEXT NOT NULL,
            service_id TEXT,
            project_id TEXT,
            node_id TEXT,
            attempt_id TEXT,
            replica INTEGER,
            reason TEXT,
            message TEXT,
            details TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX events_service ON events(service_id, id)",
        "CREATE INDEX events_node ON events(node_id, subject, id)",
        "CREATE INDEX events_at ON events(at)",
    ),
    # 11: what each attempt's executor last said of its engine: process ID, exit status
    # or signal, when it started (the node's clock) and became ready (the controller's),
    # and the readiness probe's last answer with when it came.
    (
        "ALTER TABLE inference_attempts ADD COLUMN pid INTEGER",
        "ALTER TABLE inference_attempts ADD COLUMN exit_code INTEGER",
        "ALTER TABLE inference_attempts ADD COLUMN signal INTEGER",
        "ALTER TABLE inference_attempts ADD COLUMN started_at REAL",
        "ALTER TABLE inference_attempts ADD COLUMN ready_at REAL",
        "ALTER TABLE inference_attempts ADD COLUMN health TEXT",
        "ALTER TABLE inference_attempts ADD COLUMN health_at REAL",
    ),
    # 12: single-use stream tickets (a log stream opened from a URL): only the ticket's
    # sha256 is kept, with the caller it was minted for and the stream it opens; it is
    # used at most once (used_at), before expires_at.
    (
        """CREATE TABLE stream_tickets (
            ticket_hash TEXT PRIMARY KEY,
            purpose TEXT NOT NULL,
            subject TEXT NOT NULL,
            principal_kind TEXT NOT NULL,
            principal_id TEXT NOT NULL,
            principal_expires_at REAL,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            used_at REAL
        )""",
        "CREATE INDEX stream_tickets_expiry ON stream_tickets(expires_at)",
    ),
    # 13: a replica may hold a reservation per generation and node, so a move's target
    # or a rollout's new generation holds its own beside the one still serving (each goes
    # once its attempt's end is confirmed); a running service's pending rollout (the next
    # generation's specification, started beside the serving one).
    (
        """CREATE TABLE inference_reservations_10 (
            service_id TEXT NOT NULL REFERENCES inference_services(id) ON DELETE CASCADE,
            generation INTEGER NOT NULL,
            replica INTEGER NOT NULL,
            node_id TEXT NOT NULL,
            cpus REAL NOT NULL,
            memory_bytes INTEGER NOT NULL,
            disk_bytes INTEGER NOT NULL,
            gpus TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (service_id, generation, replica, node_id)
        )""",
        """INSERT INTO inference_reservations_10 (service_id, generation, replica, node_id,
            cpus, memory_bytes, disk_bytes, gpus, created_at)
        SELECT r.service_id, s.generation, r.replica, r.node_id, r.cpus, r.memory_bytes,
            r.disk_bytes, r.gpus, r.created_at
        FROM inference_reservations r JOIN inference_services s ON s.id = r.service_id""",
        "DROP TABLE inference_reservations",
        "ALTER TABLE inference_reservations_10 RENAME TO inference_reservations",
        "CREATE INDEX inference_reservations_node ON inference_reservations(node_id)",
        """CREATE TABLE inference_rollouts (
            service_id TEXT PRIMARY KEY REFERENCES inference_services(id) ON DELETE CASCADE,
            generation INTEGER NOT NULL,
            spec TEXT NOT NULL,
            plan_digest TEXT NOT NULL,
            started_at REAL NOT NULL,
            deadline REAL NOT NULL
        )""",
    ),
    # 14: a credential's and a project's priority band (docs/priority.md): a band name of
    # the bands setting, or NULL (the project's band, else band_default).
    (
        "ALTER TABLE credentials ADD COLUMN band TEXT",
        "ALTER TABLE projects ADD COLUMN band TEXT",
    ),
    # 15: rate limits and budgets per scope, and the counters processes share (quotas).
    # A limit row is one scope's (credential, user or project) explicit limits, NULL where
    # unset; a counter row is one subject's requests, tokens and spend (milli-units) in one
    # window: a minute (rpm, tpm) or a budget period (day, month), added to by every process.
    (
        """CREATE TABLE quota_limits (
            scope TEXT NOT NULL,
            subject TEXT NOT NULL,
            rpm INTEGER,
            tpm INTEGER,
            budget INTEGER,
            period TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (scope, subject)
        )""",
        """CREATE TABLE quota_counters (
            subject TEXT NOT NULL,
            kind TEXT NOT NULL,
            window_start INTEGER NOT NULL,
            requests INTEGER NOT NULL DEFAULT 0,
            tokens INTEGER NOT NULL DEFAULT 0,
            spend INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (subject, kind, window_start)
        )""",
        "CREATE INDEX quota_counters_window ON quota_counters(kind, window_start)",
    ),
    # 16: people: account states, personal keys, services shared with people. A user is
    # active or pending (signup); personal keys belong to the reserved project `~personal`
    # (written with the first personal key or login; no one can name, list, join or create
    # it: the credential table keeps its project NOT NULL and every project route keeps
    # its scoping); a share's NULL user is everyone.
    (
        "ALTER TABLE users ADD COLUMN status TEXT NOT NULL DEFAULT 'active'",
        """CREATE TABLE service_shares (
            service_id TEXT NOT NULL REFERENCES inference_services(id) ON DELETE CASCADE,
            user_id TEXT REFERENCES users(id) ON DELETE CASCADE,
            created_at REAL NOT NULL
        )""",
        Dialects(
            sqlite="CREATE UNIQUE INDEX service_shares_one"
            " ON service_shares(service_id, ifnull(user_id, ''))",
            postgresql="CREATE UNIQUE INDEX service_shares_one"
            " ON service_shares(service_id, COALESCE(user_id, ''))",
        ),
        "CREATE INDEX service_shares_user ON service_shares(user_id)",
        "CREATE INDEX credentials_user ON credentials(user_id)",
    ),
    # 17: usage records with their project, person, model and spend (milli-units); a row
    # may sum several requests (records aggregated while the store was behind). Rows from
    # before take the project, person and model of their credential and service.
    (
        "ALTER TABLE inference_usage ADD COLUMN project_id TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE inference_usage ADD COLUMN user_id TEXT",
        "ALTER TABLE inference_usage ADD COLUMN model TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE inference_usage ADD COLUMN cost INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE inference_usage ADD COLUMN requests INTEGER NOT NULL DEFAULT 1",
        """UPDATE inference_usage SET
            project_id = COALESCE((SELECT c.project_id FROM credentials c
                WHERE c.id = inference_usage.credential_id), ''),
            user_id = (SELECT c.user_id FROM credentials c
                WHERE c.id = inference_usage.credential_id),
            model = COALESCE((SELECT s.model_id FROM inference_services s
                WHERE s.id = inference_usage.service_id), '')""",
        "CREATE INDEX inference_usage_finished ON inference_usage(finished_at)",
        "CREATE INDEX inference_usage_credential ON inference_usage(credential_id, finished_at)",
        "CREATE INDEX inference_usage_project ON inference_usage(project_id, finished_at)",
        "CREATE INDEX inference_usage_user ON inference_usage(user_id, finished_at)",
        "CREATE INDEX inference_usage_model ON inference_usage(model, finished_at)",
    ),
    # 18: scaled services (docs/inference.md, "Scaling"): the placements that run now (a
    # JSON list of indices; NULL for a service without scaling, where every one does),
    # whether an operator pinned it (never scaled to zero), and when the last scaling
    # decision was made (its cooldown survives a restart).
    (
        "ALTER TABLE inference_services ADD COLUMN active TEXT",
        "ALTER TABLE inference_services ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE inference_services ADD COLUMN scaled_at REAL",
    ),
    # 19: several controllers (docs/operations.md, "Several controllers"): the one leader
    # row (who holds the lease, the URL it is reached on, its fencing term, when the lease
    # runs out), every controller seen (for status), and each node's newest connection to
    # each controller (a node keeps one to every controller; a heartbeat is fenced only by
    # a newer connection to the same controller).
    (
        """CREATE TABLE controller_leader (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            holder TEXT NOT NULL,
            url TEXT NOT NULL,
            term INTEGER NOT NULL,
            acquired_at REAL NOT NULL,
            expires_at REAL NOT NULL
        )""",
        """CREATE TABLE controllers (
            id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            role TEXT NOT NULL,
            term INTEGER NOT NULL,
            started_at REAL NOT NULL,
            seen_at REAL NOT NULL
        )""",
        """CREATE TABLE node_links (
            node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            controller_id TEXT NOT NULL,
            connection_id TEXT NOT NULL,
            PRIMARY KEY (node_id, controller_id)
        )""",
    ),
    # 20: when an idle service was last woken. An activation is not a scaling decision
    # for the cooldown (``scaled_at``): a service woken into a burst scales out after the
    # window, not a cooldown later; a failed activation is judged from this moment.
    ("ALTER TABLE inference_services ADD COLUMN woken_at REAL",),
    # 21: how a rollout runs (docs/inference.md, "Rollout strategies"): beside the serving
    # generation (surge), or in place replica by replica (rolling, ``step`` replicas handed
    # over so far) or all at once (recreate).
    (
        "ALTER TABLE inference_rollouts ADD COLUMN strategy TEXT NOT NULL DEFAULT 'surge'",
        "ALTER TABLE inference_rollouts ADD COLUMN step INTEGER NOT NULL DEFAULT 0",
    ),
    # 22: credential names are unique among a project's live credentials (a person's own
    # in the personal project) and name them wherever an ID does. Of the unrevoked
    # credentials that shared a name before, the oldest keeps it; each later one becomes
    # ``name-<the first 8 characters of its ID>`` (docs/people.md, "Credential names").
    (
        """UPDATE credentials SET name = name || '-' || substr(id, 1, 8)
        WHERE revoked_at IS NULL AND EXISTS (
            SELECT 1 FROM credentials o
            WHERE o.project_id = credentials.project_id AND o.name = credentials.name
            AND o.revoked_at IS NULL
            AND (o.project_id != '~personal' OR o.user_id = credentials.user_id)
            AND (o.created_at < credentials.created_at
                OR (o.created_at = credentials.created_at AND o.id < credentials.id)))""",
        "CREATE INDEX credentials_name ON credentials(project_id, name)",
    ),
    # 23: each usage row the usage writer makes carries the record's ID (its controller's
    # spool name and a number; NULL for a summary row and older rows), unique, so the
    # records a SIGKILLed controller left in its spool are written once when they are
    # replayed (docs/usage.md, "Accounting").
    (
        "ALTER TABLE inference_usage ADD COLUMN record_id TEXT",
        "CREATE UNIQUE INDEX inference_usage_record ON inference_usage(record_id)",
    ),
]


#: The expand migrations (by version): each only adds, so a FICC that knows the version
#: before it runs on a database it migrated. Every new migration says here whether it is.
EXPANDS: frozenset[int] = frozenset({18, 19, 20, 21, 22, 23})


def compatible_from(version: int, expands: frozenset[int] | None = None) -> int:
    """The oldest schema version whose FICC runs on a database at ``version``: below it
    is the newest contract migration up to ``version``."""
    expands = EXPANDS if expands is None else expands
    while version in expands:
        version -= 1
    return version


def check_newer(current: int, newest: int, compatible: int | None, where: str) -> None:
    """Refuse a database at ``current``, newer than this FICC's ``newest``, unless the
    FICC that migrated it recorded it ``compatible`` from ``newest`` or older."""
    if current > newest and (compatible is None or compatible > newest):
        raise newer_schema(current, newest, where, compatible)


def newer_schema(
    current: int, newest: int, where: str, compatible: int | None = None
) -> StoreError:
    """The refusal of a database at a schema version newer than this FICC knows."""
    details: dict[str, int] = {"schema_version": current, "supported": newest}
    needs = ""
    if compatible is not None:
        details["compatible_from"] = compatible
        needs = f" (it needs schema version {compatible} or newer)"
    return StoreError(
        f"the database is at schema version {current}, newer than this FICC "
        f"understands ({newest}){needs}; upgrade FICC or use another {where}",
        details=details,
    )
