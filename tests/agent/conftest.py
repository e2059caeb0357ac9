"""Fixtures only the tests of tests/agent/ use (shared ones are in tests/conftest.py)."""
