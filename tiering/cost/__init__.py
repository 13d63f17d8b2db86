"""Prices, the cost model and the report document it produces (pure)."""
