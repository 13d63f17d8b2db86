"""The commit protocol, per segment, under partition leases."""
