"""How commands print: short human lines and tables by default, ``--json`` for scripts.

Every command that prints a result takes :func:`json_option` and ends with
:func:`emit`: the document as indented JSON with ``--json``, else what ``human``
prints. Hints and warnings go to standard error, so ``--json`` output stays one
JSON document.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from typing import Any

import click

#: ``--json``: the command's result as one JSON document instead of human output.
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON (for scripts)."
)


def echo_json(document: Any) -> None:
    """Print ``document`` as indented, key-sorted JSON."""
    click.echo(json.dumps(document, indent=2, sort_keys=True))


def emit(document: Any, as_json: bool, human: Callable[[Any], None]) -> None:
    """Print ``document`` as JSON with ``--json``, else as ``human(document)`` prints it."""
    if as_json:
        echo_json(document)
    else:
        human(document)


def echo_table(rows: Sequence[Sequence[Any]], *, err: bool = False) -> None:
    """Print ``rows`` (the first is the header) as left-aligned columns."""
    if not rows:
        return
    texts = [["" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in texts) for i in range(len(texts[0]))]
    for row in texts:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            err=err,
        )


def echo_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """Print ``label: value`` lines with the values aligned."""
    width = max((len(label) for label, _ in pairs), default=0) + 1
    for label, value in pairs:
        click.echo(f"{label + ':':<{width}} {'-' if value is None else value}".rstrip())


def hint(text: str) -> None:
    """A next step or warning for the operator, on standard error."""
    click.echo(text, err=True)


def when(timestamp: float | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SSZ`` (``-`` for none)."""
    if timestamp is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")
