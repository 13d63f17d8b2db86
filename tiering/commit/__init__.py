"""The commit protocol under partition leases: every operation staged into one journal shape and finished
through one entry point (:mod:`tiering.commit.finish`)."""
