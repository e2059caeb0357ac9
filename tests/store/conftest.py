"""Fixtures only the tests of tests/store/ use (shared ones are in tests/conftest.py)."""
