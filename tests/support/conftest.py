"""Fixtures only the tests of tests/support/ use (shared ones are in tests/conftest.py)."""
