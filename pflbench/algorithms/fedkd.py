"""fedkd: being written (a helper fills this file)."""
