"""The one content hash of settings: sha256 of their canonical JSON (sorted keys; values JSON
cannot hold are written with ``str``). A run's identity, a cache key and a sweep's grid are all
hashed here, so equal settings give equal hashes everywhere."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def settings_hash(settings: Any, length: int = 16) -> str:
    """The first ``length`` hex characters of sha256 over ``settings``' canonical JSON."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:length]
