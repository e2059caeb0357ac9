"""Fixtures only the tests of tests/models/ use (shared ones are in tests/conftest.py)."""
