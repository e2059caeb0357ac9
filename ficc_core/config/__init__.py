"""Configuration: every setting, read from defaults, a TOML file, ``FICC_*`` variables, flags.

Each later source overrides the earlier ones. Every setting is a field of
:class:`Config` whose ``help`` metadata is the one description of it: the CLI's
``--help``, ``ficc config`` and ``docs/configuration.md`` are all rendered from it.

The settings are declared by section, one module each (:mod:`.server`, :mod:`.auth`,
:mod:`.logs`, :mod:`.store`, :mod:`.models`, :mod:`.nodes`, :mod:`.inference`,
:mod:`.controllers`, :mod:`.gateway`, :mod:`.priority`, :mod:`.routing`, :mod:`.limits`,
:mod:`.scaling`, :mod:`.usage`, :mod:`.console`); :mod:`.settings` joins them into
:class:`Config`; :mod:`.loading` reads the sources; :mod:`.reference` renders the table.
A setting's name is flat whatever its section: ``FICC_<NAME>``, the TOML key ``name``,
the flag ``--name``.
"""

from __future__ import annotations

from .fields import default_data_dir, default_runtime_dir, parse_duration
from .loading import env_name, load_config
from .reference import render_reference
from .settings import Config

__all__ = [
    "Config",
    "default_data_dir",
    "default_runtime_dir",
    "env_name",
    "load_config",
    "parse_duration",
    "render_reference",
]
