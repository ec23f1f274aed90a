"""sessionstream."""
