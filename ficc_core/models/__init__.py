"""The model registry: manifests, blobs, acquisition, uploads, hub previews.

Other packages go through :class:`~ficc_core.models.registry.ModelRegistry`, except for
:func:`list_partials`, which the inference state metrics read in the transaction that
reads the services (the rest of :mod:`.repository` is this package's).
"""

from .repository import list_partials

__all__ = ["list_partials"]
