"""Fixtures only the tests of tests/cli/ use (shared ones are in tests/conftest.py)."""
