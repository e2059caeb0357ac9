"""Write a benchmark's table into docs/performance.md, between that benchmark's markers."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def write_section(name: str, heading: str, table: str) -> None:
    """Replace what lies between ``<!-- bench:NAME:start -->`` and ``...:end -->``.

    A page without the markers gets them at its end, under ``## HEADING``.
    """
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = DOC.read_text(encoding="utf-8")
    if start not in text or end not in text:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n{start}\n{end}\n"
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    DOC.write_text(f"{head}{start}\n{table.rstrip(chr(10))}\n{end}{tail}", encoding="utf-8")
