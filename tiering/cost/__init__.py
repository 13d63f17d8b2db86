"""Prices and the cost model (pure)."""
