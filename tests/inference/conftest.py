"""Fixtures only the tests of tests/inference/ use (shared ones are in tests/conftest.py)."""
