"""S3: the object store the platform works on (``store`` is the only module that imports boto3)."""
