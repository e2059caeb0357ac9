"""Fixtures only the tests of tests/system/ use (shared ones are in tests/conftest.py)."""
