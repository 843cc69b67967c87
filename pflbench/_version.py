"""The package version (its own module, so run records can read it without importing the face)."""

__version__ = "0.1.0"
