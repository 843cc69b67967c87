"""fedcp: being written (a helper fills this file)."""
