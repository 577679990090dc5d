"""Django's PostgreSQL backend, with the per-request health check made cheap."""
