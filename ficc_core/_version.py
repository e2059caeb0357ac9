"""The version of ficc-core; every built-in distribution moves in lockstep with it."""

__version__ = "0.1.0"
