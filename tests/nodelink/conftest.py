"""Fixtures only the tests of tests/nodelink/ use (shared ones are in tests/conftest.py)."""
