"""Create an endpoint (an agent credential) and print its token, once."""

import json

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from todos.access import endpoints
from todos.sqs import credentials


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
            "--queues",
            required=True,
            help="comma-separated queue names (no spaces in a name), or '*' alone",
        )
        parser.add_argument(
            "--sqs",
            action="store_true",
            help="also issue SQS credentials (access key id, secret, account id)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, name, owner, queues, sqs=False, **options):
        try:
            with transaction.atomic():
                endpoint, token = endpoints.create(name, owner, queues)
                issued = credentials.issue(endpoint) if sqs else None
        except endpoints.EndpointError as exc:
            raise CommandError(str(exc)) from None
        user, user_created = endpoint.owner, endpoint.owner_created
        grant = endpoint.queues
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
