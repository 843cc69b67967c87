"""pfedhn: being written (a helper fills this file)."""
