"""The hooks a FICC plugin implements: plugin API version 1.

A plugin is a module (or any object) that an entry point in the group
``ficc.inference`` names. It declares ``API_VERSION = 1`` and implements some of
the hooks below, each decorated with ``ficc_core.hookimpl``::

    from ficc_core import hookimpl

    API_VERSION = 1

    @hookimpl
    def ficc_register_adapters(registry):
        registry.add("my_engine", MyEngineAdapter)

A plugin implements only the hooks it needs: a hook added within API version 1
is an addition, which plugins written before it simply do not implement.

Hooks are few and synchronous: they only register things. The work itself
(translating a specification into a job, running an engine) lives in the
registered objects, whose methods core calls later.

These docstrings are the reference documentation: ``python -m ficc_core.devtools.docs_hooks``
renders them into ``docs/plugins.md``, and a test keeps the two in step. Hooks are
grouped by lifecycle under banner comments, which the renderer turns into headings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .plugins import AdapterRegistry, ExecutorRegistry, RuntimeRegistry

#: The plugin API version this FICC implements. A plugin, and every adapter or
#: executor provider it registers, must declare the same ``API_VERSION``.
API_VERSION = 1

# The spec marker is private: plugins only ever need ``ficc_core.hookimpl``.
_hookspec = pluggy.HookspecMarker("ficc")


# ---------------------------------------------------------------------------
# Registration hooks: called once per plugin while FICC builds its plugin set,
# before any service runs. A plugin is all or nothing: if one of its
# registration hooks raises, nothing it registered is kept.
# ---------------------------------------------------------------------------


@_hookspec
def ficc_register_adapters(registry: AdapterRegistry) -> None:
    """Register the engine adapters this plugin provides.

    Call ``registry.add(name, factory)`` once per adapter. ``name`` is the engine
    a service specification selects (``llama_cpp``, ``ollama``, ``vllm``, ...).
    ``factory`` is called at once with no arguments and returns the adapter: an
    object with ``API_VERSION = 1`` and a method
    ``job(specification, model_record, placement, immutable_input_references)``
    that returns a ``ficc_core.Job``. Adapters are pure translators: they do no
    I/O and never start processes, so the factory must be cheap. An adapter
    should pass the adapter conformance kit, ``ficc_core.testing.check_adapter``.

    ``registry.add`` raises ``ficc_core.PluginError`` when the name is already
    taken, when the adapter does not declare ``API_VERSION = 1``, or when it has
    no callable ``job``. Let the error propagate: the plugin is then refused, the
    error names its distribution, and every other plugin keeps working.

    :param registry:
        The ``ficc_core.AdapterRegistry`` to add adapters to.

    .. versionadded:: API 1
    """


@_hookspec
def ficc_register_executor_providers(registry: ExecutorRegistry) -> None:
    """Register the executor providers this plugin provides.

    Call ``registry.add(name, factory)`` once per provider. ``name`` is the
    executor a runtime binds (``process``, ``container``, ...). ``factory`` is
    the provider class itself, with a class attribute ``API_VERSION = 1``; it is
    not instantiated here. A node agent instantiates it later with its node's
    configuration. A provider owns engine processes or containers, their
    resource limits, sockets and logs, and the fenced endpoint action; its
    instances implement the typed protocol ``ficc_core.ExecutorProvider``
    (``run``, ``snapshot``, ``launch``, ``status``, ``stop``, ``logs``,
    ``open``, ``read``, ``cancel``, ...) and should pass the executor
    conformance kit in ``ficc_core.testing.executor_kit``.

    ``registry.add`` raises ``ficc_core.PluginError`` when the name is already
    taken, when the factory is not a class, or when it does not declare
    ``API_VERSION = 1``. Let the error propagate: the plugin is then refused, the
    error names its distribution, and every other plugin keeps working.

    :param registry:
        The ``ficc_core.ExecutorRegistry`` to add provider classes to.

    .. versionadded:: API 1
    """


@_hookspec
def ficc_register_runtimes(registry: RuntimeRegistry) -> None:
    """Declare the engine runtimes this distribution installs on a node.

    A runtime distribution (``ficc-llama-server``) installs an engine executable;
    this hook tells every node agent of the same installation about it, so a node
    advertises the runtime without any agent configuration. Call
    ``registry.add(name, provider=..., executable=..., engines=[...],
    isolation=..., network="none")`` once per runtime. ``name`` is the runtime's
    name in the node snapshot (``llama_server``); ``provider`` is the executor
    provider that runs it (``process``); ``executable`` is the absolute path of
    the installed executable, which a specification's ``image_executable`` names;
    ``engines`` are the engines (adapters) it serves (``llama_cpp``);
    ``isolation`` and ``network`` are what a specification's runtime binds
    (managed services need ``network`` ``none``, the default). Two keywords are
    optional: ``requires_gpu=True`` for a runtime that runs only on a node with a
    GPU (create, replace, start and move then refuse a CPU-only node with 422
    ``tier_mismatch``), and ``default_gpu_memory_bytes``, the device memory a
    preview suggests a replica reserves on each GPU. It is an addition to API 1:
    a plugin that declares no runtime does not implement it.

    Declare where the executable is; do not read it: the agent hashes it off its
    event loop, advertises that sha256 as the runtime's image digest, and leaves
    out (reporting why) a runtime whose executable is missing or whose provider
    is not loaded on the node. A runtime the operator declares in the agent's
    TOML file under the same name replaces the plugin's.

    ``registry.add`` raises ``ficc_core.PluginError`` when the name is already
    taken or is not a runtime name, when the executable is not an absolute path,
    when no engine is named, or when the provider, an engine, the isolation or
    the network is not an identifier. Let the error propagate: the plugin is then
    refused, the error names its distribution, and every other plugin keeps
    working.

    :param registry:
        The ``ficc_core.RuntimeRegistry`` to declare runtimes in.

    .. versionadded:: API 1
    """
