"""Policies (per-topic codec and storage tiering, ``policy``) and the storage-class tiering planner (``tier``)."""
