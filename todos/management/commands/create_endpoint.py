"""Create an endpoint (an agent credential) and print its token, once."""

import json

from django.core.management.base import BaseCommand, CommandError

from todos import endpoints


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
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, name, owner, queues, **options):
        try:
            endpoint, token = endpoints.create(name, owner, queues)
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
                    "The token is shown only now: keep it in your agent's secrets.",
                ]
            )
        )
