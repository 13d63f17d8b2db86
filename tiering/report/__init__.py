"""The cost savings report: prices (``prices``), the model (``model``), renderers (``render``) and its
publication on S3 with the ledger across runs (``publish``)."""
