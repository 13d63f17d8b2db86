"""What a run will do: the plan document, the scanner, S3 Inventory reports, policies, the plan's chunk files
and the dry run's estimate."""
