from django.apps import AppConfig


class TodosConfig(AppConfig):
    name = "todos"
    verbose_name = "Todos"

    def ready(self):
        # Registers the key checks (python manage.py check), and connects the
        # credential cache's receivers (todos.auth: an endpoint or SQS key saved
        # or deleted in this process is forgotten by its cache at once).
        from todos import auth, checks  # noqa: F401
