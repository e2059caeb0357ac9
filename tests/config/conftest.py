"""Fixtures only the tests of tests/config/ use (shared ones are in tests/conftest.py)."""
