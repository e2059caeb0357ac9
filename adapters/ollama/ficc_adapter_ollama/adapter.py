"""The ollama adapter: a service specification in, a job out."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ficc_core import Job, Placement, Specification


class OllamaAdapter:
    """Translate a service specification into a job for Ollama."""

    API_VERSION = 1
    name = "ollama"

    def job(
        self,
        specification: Specification,
        model_record: object,
        placement: Placement,
        immutable_input_references: object,
    ) -> Job:
        """Return the job that runs one replica of ``specification`` on ``placement``."""
        raise NotImplementedError(
            f"the {self.name!r} adapter is registered, but its translation of a "
            "specification into a job lands with the adapters issue"
        )
