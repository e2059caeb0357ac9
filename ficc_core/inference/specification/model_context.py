"""A verified model as a service needs it: its record for the adapters and its job inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from ...base.errors import Conflict, NotFound
from ...models.records import ModelState
from ...schema import JobInput, ModelManifest, ModelMetadata, ModelRecord, SchemaError, structure
from ...schema._convert import MAX_SAFE_INTEGER, integer

if TYPE_CHECKING:
    from ...models.blobs import BlobStore
    from ...models.gguf_types import AttentionShape
    from ...models.records import Model
    from ...models.registry import ModelRegistry


@attrs.frozen(kw_only=True)
class ModelContext:
    """A verified model as the adapters and the launch need it."""

    record: ModelRecord
    size: int = integer(0, MAX_SAFE_INTEGER)
    inputs: tuple[JobInput, ...]
    blobs: Mapping[str, int]
    directories: Mapping[str, Mapping[str, tuple[str, int]]]
    #: What sizes its KV cache, when its GGUF header says (the suggested memory limit).
    attention: AttentionShape | None = None
    #: Why its GGUF header could not be read (an engine will not load it either), or None.
    header_problem: str | None = None


def _model_field_error(message: str) -> SchemaError:
    return SchemaError([{"path": "$.model_id", "message": message}], what="specification")


class ModelContexts:
    """Builds :class:`ModelContext` values (the registry reads each GGUF header once).

    :param models: the model registry the contexts come from.
    :param blobs: where the verified files are (their paths become job inputs).
    """

    def __init__(self, *, models: ModelRegistry, blobs: BlobStore) -> None:
        self.models = models
        self.blobs = blobs

    async def resolve(self, project_id: str, reference: str) -> str:
        """The ID of the project's model ``reference``: its ID or its name.

        Names are unique in a project, and registration refuses a name that is another
        model's ID (a database from before that check may hold one).

        :raises Conflict: ``model_ambiguous`` when ``reference`` is one model's ID and
            another's name; its ``details.candidates`` lists both IDs.
        """
        found = [m for m in await self.models.list(project_id) if reference in (m.id, m.name)]
        if len(found) > 1:
            ids = sorted(m.id for m in found)
            named = next(m.id for m in found if m.name == reference)
            # Registration refuses such a name now; a database from before may hold one.
            raise Conflict(
                f"{reference!r} names {len(found)} models of this project (as an ID and as a "
                f"name: {', '.join(ids)}); delete model {named} (named {reference!r}) and "
                "register it again under another name",
                code="model_ambiguous",
                details={"reference": reference, "candidates": ids, "path": "$.model_id"},
            )
        return found[0].id if found else reference

    async def get(self, project_id: str, model_id: str) -> ModelContext:
        """The verified model ``model_id`` of the project, with its job inputs.

        :raises SchemaError: at ``$.model_id`` when it is missing or not verified.
        """
        try:
            model = await self.models.get(project_id, model_id)
        except NotFound:
            raise _model_field_error(f"no model {model_id!r} in this project") from None
        if model.state != ModelState.VERIFIED:
            raise _model_field_error(
                f"model {model_id!r} is {model.state}, not verified; "
                "upload or acquire its files first"
            )
        manifest = structure(model.manifest, ModelManifest, what="stored manifest")
        files = {f.path: f for f in manifest.files}
        directories: dict[str, dict[str, tuple[str, int]]] = {}
        if len(manifest.weights) == 1:
            [weights] = manifest.weights
            path = self.blobs.published_path(weights.sha256)
            inputs = (JobInput(id="model", path=str(path), digest="sha256:" + weights.sha256),)
        else:
            # A directory (every file under its own path): a split GGUF's parts must lie
            # side by side under their names, and a Hugging Face directory is one.
            tree = {p: (f.sha256, f.size) for p, f in files.items()}
            # Where this machine assembles it (the embedded node reads it in place);
            # a remote node stages the same files and assembles its own copy.
            inputs = (JobInput(id="model", path=str(self.blobs.tree_path(tree))),)
            directories = {"model": tree}
        metadata, attention = await self._gguf_metadata(model)
        problem = self.models.header_problem(model) if model.format == "gguf" else None
        record = ModelRecord(
            id=model.id, revision=model.digest, manifest=manifest, metadata=metadata
        )
        return ModelContext(
            record=record,
            size=sum(f.size for f in manifest.files),
            inputs=inputs,
            blobs={"sha256:" + f.sha256: f.size for f in manifest.files},
            directories=directories,
            attention=attention,
            header_problem=problem,
        )

    async def _gguf_metadata(self, model: Model) -> tuple[ModelMetadata, AttentionShape | None]:
        header = await self.models.metadata(model)
        if header is None:
            return ModelMetadata(), None
        metadata = ModelMetadata(
            architecture=header.architecture,
            context_length=header.context_length,
            parameter_count=header.parameter_count,
            quantisation=header.quantisation,
            chat_template=header.chat_template,
            embedding=header.embedding,
        )
        return metadata, header.attention
