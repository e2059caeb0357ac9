"""Fixtures only the tests of tests/devtools/ use (shared ones are in tests/conftest.py)."""
