"""Print or rotate an endpoint's SQS credentials."""

import json
import uuid

from django.core.management.base import BaseCommand, CommandError

from todos.management.commands.create_endpoint import credentials_lines
from todos.models import Endpoint
from todos.sqs import credentials


class Command(BaseCommand):
    help = (
        "Show an endpoint's SQS access key id and account id, issuing credentials "
        "when it has none; --rotate replaces the key pair (the old key stops at "
        "once; the account id, and so every queue URL, stays). A secret is shown "
        "only when it is issued."
    )

    def add_arguments(self, parser):
        parser.add_argument("endpoint_id", help="the endpoint's id")
        parser.add_argument(
            "--rotate", action="store_true", help="issue a new key pair"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, endpoint_id, rotate=False, **options):
        try:
            endpoint = Endpoint.objects.get(id=uuid.UUID(endpoint_id))
        except (ValueError, Endpoint.DoesNotExist):
            raise CommandError(f"no endpoint {endpoint_id!r}") from None
        if not endpoint.is_active:
            raise CommandError(f"endpoint {endpoint_id} is revoked")
        existing = credentials.shown(endpoint)
        issued = credentials.issue(endpoint) if rotate or existing is None else None
        data = {"endpoint_id": str(endpoint.id), "name": endpoint.name}
        if issued is not None:
            data.update(issued.to_dict(), issued=True)
        else:
            data.update(
                sqs_access_key_id=existing.access_key_id,
                sqs_account_id=existing.account_id,
                issued=False,
            )
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        lines = [f"Endpoint {endpoint.name} ({endpoint.id})"]
        if issued is not None:
            lines += credentials_lines(issued)
            lines.append(
                "The secret is shown only now: keep it in your client's secrets."
            )
        else:
            lines += [
                f"  sqs access key id: {existing.access_key_id}",
                f"  sqs account id:    {existing.account_id}",
                "The secret is not shown again: --rotate issues a new key pair.",
            ]
        self.stdout.write("\n".join(lines))
