"""Regenerate the settings table in ``docs/configuration.md`` from :class:`Config`.

Run ``python -m ficc_core.devtools.docs_config``; a test fails when the file has drifted.
"""

from __future__ import annotations

from pathlib import Path

from ..config import render_reference

START, END = "<!-- settings:start -->", "<!-- settings:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def rendered(text: str) -> str:
    """Return ``text`` with the settings section replaced by the current table."""
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{render_reference()}{END}{tail}"


def main() -> None:
    """Rewrite the generated section in place."""
    DOC.write_text(rendered(DOC.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
