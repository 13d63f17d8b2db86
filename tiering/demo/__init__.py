"""Demos and the generated data they use; not imported by the product's layers."""
