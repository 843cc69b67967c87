"""The one exception type for bad user input.

The CLI turns it into a single ``Error: ...`` line and exit code 2; library users get a
``ValueError`` they can catch.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad input: an unknown name, an out-of-range value, an unreadable file, ..."""
