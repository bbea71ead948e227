"""What the tests build and run: tiny models, a local hub, an S3 server, worker processes, helpers."""
