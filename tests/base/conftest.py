"""Fixtures only the tests of tests/base/ use (shared ones are in tests/conftest.py)."""
