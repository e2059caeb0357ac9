"""Discover, check and register FICC plugins: the public names plugin authors and FICC use.

- :mod:`.loader`: ``build_plugin_manager()`` loads the entry points of the group
  ``ficc.inference`` into a fresh plugin set (one per process, passed to what
  needs it) and reports what loaded and what was refused;
- :mod:`.registries`: the adapter and executor registries a plugin's
  registration hooks add to, and the records of the report;
- :mod:`.runtimes`: the runtime registry, and the runtime declarations it holds.
"""

import pluggy

from ..executor.protocol import ExecutorProvider
from .loader import (
    DISABLE_AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PluginSet,
    autoload_enabled,
    build_plugin_manager,
)
from .registries import Adapter, AdapterRegistry, ExecutorRegistry, PluginOrigin, PluginRecord
from .runtimes import DeclaredRuntime, RuntimeRegistry

#: Marks a function of a plugin as the implementation of the hook of the same name.
hookimpl = pluggy.HookimplMarker("ficc")

__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "Adapter",
    "AdapterRegistry",
    "DeclaredRuntime",
    "ExecutorProvider",
    "ExecutorRegistry",
    "PluginOrigin",
    "PluginRecord",
    "PluginSet",
    "RuntimeRegistry",
    "autoload_enabled",
    "build_plugin_manager",
    "hookimpl",
]
