"""The segment lifecycle: its vocabulary (enums), the journal entry of an operation in flight, and the
partition's state document of what each segment became (the one module here that reads and writes S3)."""
