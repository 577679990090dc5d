from django.apps import AppConfig


class TodosConfig(AppConfig):
    name = "todos"
    verbose_name = "Todos"

    def ready(self):
        # Registers the key checks (python manage.py check), and connects the
        # credential cache's receivers (todos.access.auth: an endpoint or SQS key saved
        # or deleted in this process is forgotten by its cache at once).
        from todos import checks  # noqa: F401
        from todos.access import auth  # noqa: F401
        from todos.telemetry.logs import redact_server_logs

        # gunicorn and uvicorn set up their handlers before Django starts:
        # their log lines (the access log, errors) never show a credential.
        redact_server_logs()
        # Tracing is on only when the OTEL_* environment names an exporter.
        from todos.telemetry import tracing

        tracing.configure()
