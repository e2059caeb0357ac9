"""Models (docs/models.md): hub previews, acquisitions, uploads, the blob reserve."""

from __future__ import annotations

from pathlib import Path

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class ModelSettings:
    """Hub previews, acquisitions, uploads and the blob store (a section of Config)."""

    hub_url: str = setting(
        "https://huggingface.co",
        "Base URL of the model hub for hub previews (a mirror works; Hugging Face API shapes).",
        kind="str",
    )
    ca_bundle: Path | None = setting(
        None,
        "PEM bundle of CAs trusted for acquisitions and hub previews (default: certifi's).",
        kind="path",
        converter=attrs.converters.optional(Path),
    )
    allow_private_addresses: bool = setting(
        False,
        "Allow acquisitions, redirects and hub previews to reach loopback and private addresses.",
        kind="bool",
    )
    acquisition_concurrency: int = setting(
        2,
        "How many file acquisitions download at once.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    acquisition_retries: int = setting(
        5,
        "Retries of a file after a dropped connection or timeout, with backoff from 0.5 s to 8 s.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    connect_timeout: float = setting(
        15.0, "Connect timeout for acquisitions and hub requests (duration).", kind="duration"
    )
    read_timeout: float = setting(
        60.0,
        "Longest wait for the next bytes of a download or hub response (duration).",
        kind="duration",
    )
    storage_reserve: int = setting(
        32 << 20,
        "Bytes held free on the blob store's disk (a file data_dir/blobs/reserve): when an "
        "upload or acquisition fills the disk, they are given back so that the store can "
        "still write and models can be deleted; blob writes are refused "
        "(507 insufficient_storage) until the reserve can be held again. 0: none.",
        kind="int",
        validator=attrs.validators.ge(0),
    )
    partial_tidy_after: float = setting(
        300.0,
        "How long a partial (a model file being uploaded or acquired) must go without a "
        "write before the leader's tidying may touch it, so that an upload through another "
        "controller sharing the blob directory is never disturbed; tidying runs when a "
        "controller starts leading and every half of this (duration, above 30 s).",
        kind="duration",
        validator=attrs.validators.ge(0),
    )
    upload_idle_timeout: float = setting(
        60.0,
        "Longest a byte upload may go without receiving a byte before it is refused (408) "
        "and its upload slot freed (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    max_redirects: int = setting(
        5,
        "Redirects followed per request; each target is re-checked (HTTPS, address).",
        kind="int",
        validator=attrs.validators.ge(0),
    )
