"""Fixtures only the tests of tests/plugins/ use (shared ones are in tests/conftest.py)."""
