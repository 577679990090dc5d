from django.apps import AppConfig


class TodosConfig(AppConfig):
    name = "todos"
    verbose_name = "Todos"

    def ready(self):
        # Registers the key checks (python manage.py check).
        from todos import checks  # noqa: F401
