"""The SQS-compatible surface (CONTRACT §11): AWS JSON 1.0 over SigV4 at ``POST /``."""
