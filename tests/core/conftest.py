"""Fixtures only the tests of tests/core/ use (shared ones are in tests/conftest.py)."""
