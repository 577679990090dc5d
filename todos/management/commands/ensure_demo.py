"""Ensure the demo operator login and demo endpoint exist, and print them."""

import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from todos.access import auth, endpoints
from todos.models import Endpoint

TOKEN_FILE = Path(settings.BASE_DIR) / ".switchboard-demo-token"


class Command(BaseCommand):
    help = (
        "Ensure a demo staff login and a demo endpoint (every queue) exist, and "
        "print the login and the endpoint's token. The token is kept in "
        ".switchboard-demo-token (git-ignored, mode 600) so restarts reuse it."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--url",
            default="http://127.0.0.1:8000",
            help="Where the server will listen, for the printed links "
            "(default http://127.0.0.1:8000).",
        )

    def handle(self, *args, **options):
        base = options["url"].rstrip("/")
        username = os.environ.get("SWITCHBOARD_DEMO_USER", "operator")
        password = os.environ.get("SWITCHBOARD_DEMO_PASSWORD", "switchboard")
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(password)
            user.save()

        demos = Endpoint.objects.filter(name="demo", owner=user)
        endpoint = demos.filter(revoked_at__isnull=True).order_by("-created_at").first()
        token = TOKEN_FILE.read_text().strip() if TOKEN_FILE.exists() else ""
        notes = []
        if endpoint is None:
            # A revoked demo endpoint stays revoked: its token may have leaked.
            if demos.exists():
                notes.append(
                    "  (the demo endpoint was revoked; this is a new one, "
                    "with a new token)"
                )
            endpoint, token = endpoints.create("demo", user, [endpoints.EVERY_QUEUE])
        elif not token or auth.endpoint_for_token(token) != endpoint:
            token = endpoints.rotate_token(endpoint)
        TOKEN_FILE.write_text(token + "\n")
        TOKEN_FILE.chmod(0o600)

        login = (
            f"{username} / {password}"
            if created or user.check_password(password)
            else f"{username} (its password was changed since)"
        )
        self.stdout.write(
            "\n".join(
                [
                    "",
                    "Switchboard is ready.",
                    f"  Board:          {base}/board/",
                    f"  Operator login: {login}",
                    f"  Demo endpoint:  {endpoint.id} (every queue)",
                    *notes,
                    f"  Endpoint token: {token}",
                    "  Try:  curl -s -H 'Authorization: Bearer <token>' "
                    f"{base}/api/v1/todos",
                    "",
                ]
            )
        )
