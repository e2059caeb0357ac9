"""Conformance kits third parties run against their own plugins.

``ficc_core.testing.executor_kit`` checks an executor provider against the
executor contract, using the stand-in engine in ``ficc_core.testing.standin_engine``.
"""
