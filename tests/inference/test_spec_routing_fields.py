"""The specification's routing fields and what publication makes of them.

``description``, ``aliases``, ``fallbacks``, ``context_length``, ``max_output`` and
``capabilities``: their validation (each refusal at its path), the canonical JSON of
a specification without them (its digest as before they existed), and the live view's
``names``, ``context_length`` and ``capabilities``; the CLI's options that set them.
"""

from __future__ import annotations

import json

import attrs
import pytest
from click.testing import CliRunner

from ficc_core.cli.inference_create import partial_spec
from ficc_core.cli.main import cli
from ficc_core.inference.reconciliation.publication import context_length, publish, served_names
from ficc_core.inference.records import ServiceRecord
from ficc_core.routing.live import LiveTable
from ficc_core.schema import SchemaError, Specification, canonical_json, structure
from ficc_core.testing.adapter_cases import make_case

from ..schema.test_schema_spec import SPECIFICATION

#: SPECIFICATION's digest, computed by the code before the routing fields existed
#: (commit 23d2618): a specification that does not use them keeps its digest.
DIGEST_BEFORE = "sha256:6f26403c4b90b84726e782e65b1b918dd71b4586e71cb2c517a567065d7ffa6b"


def _spec(**fields: object) -> Specification:
    return structure({**SPECIFICATION, **fields}, Specification)


def _refusal(**fields: object) -> dict[str, str]:
    with pytest.raises(SchemaError) as caught:
        _spec(**fields)
    [error] = caught.value.errors
    return error


def test_a_specification_without_the_routing_fields_keeps_its_digest_and_json():
    spec = _spec()
    assert spec.digest() == DIGEST_BEFORE
    text = canonical_json(spec).decode()
    for name in ("description", "aliases", "fallbacks", "context_length", "max_output"):
        assert f'"{name}"' not in text
    assert '"capabilities"' not in text
    with_fields = _spec(description="chat", aliases=["gpt-4o-mini"], max_output=64)
    assert with_fields.digest() != DIGEST_BEFORE
    # They round-trip through the canonical JSON (as stored).
    again = structure(_as_json(with_fields), Specification)
    assert again == with_fields


def _as_json(spec: Specification) -> object:
    return json.loads(canonical_json(spec))


def test_the_routing_fields_are_accepted_within_their_bounds():
    spec = _spec(
        description="The small chat model, for drafts",
        aliases=["gpt-4o-mini", "chat"],
        fallbacks=["bigger"],
        context_length=1024,
        max_output=1024,
        capabilities={"tools": True, "vision": False},
    )
    assert spec.aliases == ("gpt-4o-mini", "chat")
    assert spec.fallbacks == ("bigger",)
    assert spec.capabilities is not None and spec.capabilities.claimed() == ("tools",)


@pytest.mark.parametrize(
    ("fields", "path", "message"),
    [
        ({"description": "x" * 1001}, "$.description", "at most 1000"),
        ({"description": 7}, "$.description", ""),
        ({"aliases": ["ok", "bad name"]}, "$.aliases[1]", "must be an alias"),
        ({"aliases": ["same", "same"]}, "$.aliases[1]", "repeats"),
        ({"aliases": [f"a{i}" for i in range(17)]}, "$.aliases", "at most 16"),
        ({"fallbacks": ["smollm"]}, "$.fallbacks", "must not name the service itself"),
        ({"fallbacks": [""]}, "$.fallbacks[0]", "must be an alias"),
        ({"context_length": 0}, "$.context_length", ""),
        ({"context_length": 4096}, "$.context_length", "at most the context (2048)"),
        ({"max_output": 2049}, "$.max_output", "at most the context length (2048)"),
        ({"context_length": 512, "max_output": 513}, "$.max_output", "(512)"),
        ({"capabilities": {"tools": "yes"}}, "$.capabilities.tools", ""),
        ({"capabilities": {"telepathy": True}}, "$.capabilities.telepathy", ""),
    ],
)
def test_each_routing_field_is_refused_at_its_path(fields, path, message):
    error = _refusal(**fields)
    assert error["path"] == path
    assert message in error["message"]


def _record(**metadata: object):
    record = make_case("llama_cpp").model_record  # manifest name "Small model", 8,192 trained
    return attrs.evolve(record, metadata=attrs.evolve(record.metadata, **metadata))


def test_the_context_length_is_the_specifications_else_its_context_bounded_by_the_model():
    model = _record(context_length=1024)
    assert context_length(_spec(), None) == 2048  # the context, nothing known of the model
    assert context_length(_spec(), model) == 1024  # the model was trained on less
    assert context_length(_spec(), _record(context_length=8192)) == 2048
    assert context_length(_spec(), _record(context_length=None)) == 2048
    assert context_length(_spec(context_length=1500), model) == 1500  # the operator's word


def test_the_names_are_the_aliases_then_the_models_name_once():
    model = _record()
    assert served_names(_spec(), None) == ()
    assert served_names(_spec(), model) == ("Small model",)
    assert served_names(_spec(aliases=["a", "b"]), model) == ("a", "b", "Small model")
    named = attrs.evolve(model, manifest=attrs.evolve(model.manifest, name="chat"))
    assert served_names(_spec(alias="chat"), named) == ()  # the alias already
    assert served_names(_spec(aliases=["x", "chat"]), named) == ("x", "chat")


def test_publication_puts_the_routing_fields_in_the_live_view():
    spec = _spec(
        description="drafts",
        aliases=["chat"],
        fallbacks=["bigger"],
        max_output=100,
        capabilities={"tools": True},
    )
    record = ServiceRecord(
        id="svc-1",
        project_id="p",
        alias=spec.alias,
        model_id=spec.model_id,
        spec=canonical_json(spec).decode(),
        revision=1,
        generation=1,
        desired="running",
        state="ready",
        reason=None,
        plan_digest=None,
        created_at=1700000000.5,
        updated_at=1700000001.0,
    )
    live = LiveTable()
    publish(live, None, record, spec, [], ("chat", "streaming"), "serving", model=_record())  # type: ignore[arg-type]
    view = live.get("svc-1")
    assert view is not None
    assert view.names == ("chat", "Small model")
    assert (view.description, view.context_length, view.max_output) == ("drafts", 2048, 100)
    assert view.fallbacks == ("bigger",)
    assert view.capabilities == ("chat", "streaming", "tools")
    assert view.created == 1700000000
    assert live.version == 1


def test_the_cli_sends_the_routing_options_in_the_partial_specification():
    spec = partial_spec(
        model="m",
        engine="llama_cpp",
        alias="chat",
        replicas=1,
        context=2048,
        concurrency=4,
        description="drafts",
        aliases=("gpt-4o-mini",),
        fallbacks=(),
        context_length=None,
        max_output=64,
    )
    assert spec["description"] == "drafts"
    assert spec["aliases"] == ("gpt-4o-mini",)
    assert spec["max_output"] == 64
    assert "fallbacks" not in spec and "context_length" not in spec
    plain = partial_spec(
        model="m", engine="llama_cpp", alias="chat", replicas=1, context=2048, concurrency=4
    )
    assert set(plain) == {"alias", "model_id", "engine", "context", "concurrency", "placements"}


def test_the_cli_refuses_routing_options_beside_a_specification_file(tmp_path):
    document = tmp_path / "spec.json"
    document.write_text("{}")
    result = CliRunner().invoke(
        cli,
        ["inference", "--token", "t", "create", str(document), "--fallback", "other"],
        env={"FICC_URL": None, "FICC_TOKEN": None},
    )
    assert result.exit_code == 2
    assert "SPEC_FILE carries its own fields" in result.output
