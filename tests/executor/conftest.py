"""Fixtures only the tests of tests/executor/ use (shared ones are in tests/conftest.py)."""
