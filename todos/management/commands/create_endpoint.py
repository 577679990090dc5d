"""Create an endpoint (an agent credential) and print its token, once."""

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from todos.models import Endpoint
from todos.sqs import credentials


def parse_queues(raw):
    """Return the queue grant of a comma-separated list; '*' grants every queue."""
    queues = [name.strip() for name in raw.split(",") if name.strip()]
    if not queues:
        raise CommandError("--queues needs at least one queue name, or '*'")
    if "*" in queues:
        return ["*"]
    too_long = [name for name in queues if len(name) > 200]
    if too_long:
        raise CommandError(f"queue names are at most 200 characters: {too_long[0]!r}")
    return list(dict.fromkeys(queues))


class Command(BaseCommand):
    help = (
        "Create an endpoint owned by a user (created if missing), granted the given "
        "queues ('*' = every queue), and print its token. The token is shown this "
        "once; only its hash is stored."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="a name for the endpoint, e.g. the agent's")
        parser.add_argument(
            "--owner", required=True, help="username of the owning human"
        )
        parser.add_argument(
            "--queues", required=True, help="comma-separated queue names, or '*'"
        )
        parser.add_argument(
            "--sqs",
            action="store_true",
            help="also issue SQS credentials (access key id, secret, account id)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, name, owner, queues, sqs=False, **options):
        name = name.strip()
        if not name or len(name) > 200:
            raise CommandError("NAME must be 1 to 200 characters")
        if not owner.strip():
            raise CommandError("--owner must name a user")
        grant = parse_queues(queues)
        with transaction.atomic():
            user, user_created = get_user_model().objects.get_or_create(username=owner)
            endpoint = Endpoint(name=name, owner=user, queues=grant)
            token = endpoint.set_new_token()
            endpoint.save()
            issued = credentials.issue(endpoint) if sqs else None
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "endpoint_id": str(endpoint.id),
                        "name": endpoint.name,
                        "owner": user.get_username(),
                        "owner_created": user_created,
                        "queues": grant,
                        "token": token,
                        **(issued.to_dict() if issued else {}),
                    }
                )
            )
            return
        created_note = " (created)" if user_created else ""
        self.stdout.write(
            "\n".join(
                [
                    f"Endpoint {endpoint.name} ({endpoint.id})",
                    f"  owner:  {user.get_username()}{created_note}",
                    f"  queues: {', '.join(grant)}",
                    f"  token:  {token}",
                    *(credentials_lines(issued) if issued else []),
                    "The token is shown only now: keep it in your agent's secrets.",
                ]
            )
        )


def credentials_lines(issued):
    """The SQS credentials as the commands print them (the secret is shown once)."""
    return [
        f"  sqs access key id:     {issued.access_key_id}",
        f"  sqs secret access key: {issued.secret_access_key}",
        f"  sqs account id:        {issued.account_id}",
    ]
