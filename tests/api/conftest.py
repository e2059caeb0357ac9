"""Fixtures only the tests of tests/api/ use (shared ones are in tests/conftest.py)."""
