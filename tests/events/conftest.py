"""Fixtures only the tests of tests/events/ use (shared ones are in tests/conftest.py)."""
