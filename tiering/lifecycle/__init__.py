"""The segment lifecycle's vocabulary and the journal entry: typed, versioned, no I/O."""
