"""Fixtures only the tests of tests/controller/ use (shared ones are in tests/conftest.py)."""
