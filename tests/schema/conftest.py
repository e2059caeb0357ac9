"""Fixtures only the tests of tests/schema/ use (shared ones are in tests/conftest.py)."""
