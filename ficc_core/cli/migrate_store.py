"""``ficc admin migrate-store``: copy an installation's SQLite store into PostgreSQL
(docs/operations.md#store)."""

from __future__ import annotations

from pathlib import Path

import click

from ..base.errors import StoreError, StoreNotEmpty
from ..store import is_postgres_url
from .output import emit, json_option

#: The exit status when the destination already holds data (anything else failing is 1).
EXIT_NOT_EMPTY = 3


class _Refused(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        # click's stubs make exit_code a ClassVar; click reads it from the instance.
        self.exit_code = exit_code  # type: ignore[misc]


@click.command("migrate-store")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="sqlite:PATH",
    help="The SQLite store to copy: sqlite: and its file (data_dir/ficc.sqlite3).",
)
@click.option(
    "--to",
    "destination",
    required=True,
    metavar="postgresql://...",
    help="The empty PostgreSQL database to fill (a libpq URL, as database_url takes).",
)
@json_option
def migrate_store_command(source: str, destination: str, as_json: bool) -> None:
    """Copy every table of an SQLite store into an empty PostgreSQL database.

    One transaction: the destination gets the schema and every row, or nothing. A
    destination that already holds data is refused (exit status 3). Stop the
    controllers first; then point them at the destination (database_url).
    """
    from ..store.transfer import migrate_store  # loads psycopg only for this command

    if not source.startswith("sqlite:"):
        raise click.BadParameter("expected sqlite:PATH", param_hint="--from")
    if not is_postgres_url(destination):
        raise click.BadParameter("expected a postgresql://... URL", param_hint="--to")
    path = Path(source.removeprefix("sqlite:")).expanduser()
    try:
        copied = migrate_store(
            path,
            destination,
            progress=None if as_json else lambda t, n: click.echo(f"copied {n} rows of {t}"),
        )
    except StoreNotEmpty as exc:
        raise _Refused(f"{exc.message} [{exc.code}]", EXIT_NOT_EMPTY) from None
    except StoreError as exc:
        raise _Refused(f"{exc.message} [{exc.code}]") from None

    def human(document: dict) -> None:  # each table was reported as it was copied
        click.echo(f"copied {document['rows']} rows of {len(document['tables'])} tables")

    emit({"tables": copied, "rows": sum(copied.values())}, as_json, human)
