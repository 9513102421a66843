"""Test-only helpers shared by the unit and integration suites."""
