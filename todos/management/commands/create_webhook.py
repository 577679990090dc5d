"""Create a webhook source and its routes."""

import json

from django.core.management.base import BaseCommand, CommandError

from todos.webhooks import deliveries, signatures, sources


class Command(BaseCommand):
    help = (
        "Create a webhook source reached at POST /hooks/SLUG, signed with SECRET, "
        "whose deliveries become one todo per --route (ENDPOINT_ID:QUEUE)."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug", help="the source's name in /hooks/SLUG")
        parser.add_argument(
            "--secret",
            required=True,
            help="the shared signing secret the sender also holds",
        )
        parser.add_argument(
            "--route",
            action="append",
            default=[],
            metavar="ENDPOINT_ID:QUEUE",
            required=True,
            help="a target of every delivery (repeat for more)",
        )
        parser.add_argument(
            "--scheme",
            default="github",
            choices=sorted(signatures.SCHEMES),
            help="how deliveries are signed (default: github); stripe and "
            "standard-webhooks are timestamped, so a stale or replayed delivery is "
            "refused (a standard-webhooks secret is whsec_<base64>)",
        )
        parser.add_argument(
            "--assignee",
            default="",
            help="the worker every route's todos are assigned to",
        )
        parser.add_argument(
            "--title",
            default="",
            metavar="TEMPLATE",
            help="title template over "
            + ", ".join("$" + f for f in deliveries.TITLE_FIELDS),
        )
        parser.add_argument(
            "--priority",
            type=int,
            choices=range(1, 6),
            metavar="1-5",
            help="every route's todos' priority: 1 is claimed first (default 3)",
        )
        parser.add_argument(
            "--group",
            default="",
            metavar="TEMPLATE",
            help="derive each todo's group from the delivery: payload paths in "
            "braces, e.g. {repository.full_name}; a path the delivery lacks "
            "leaves the todo without a group",
        )
        parser.add_argument(
            "--signature-header",
            default="",
            help="header holding the signature (scheme default)",
        )
        parser.add_argument(
            "--delivery-header",
            default="",
            help="header holding the delivery id (scheme default)",
        )
        parser.add_argument(
            "--event-header",
            default="",
            help="header holding the event name (scheme default)",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the source as JSON"
        )

    def handle(self, *args, **options):
        try:
            routes = [
                sources.RouteSpec(
                    spec.endpoint_id,
                    spec.queue,
                    options["assignee"],
                    options["title"],
                    options["priority"],
                    options["group"],
                )
                for spec in map(sources.parse_route, options["route"])
            ]
            source = sources.create_source(
                options["slug"],
                options["secret"],
                routes,
                scheme=options["scheme"],
                signature_header=options["signature_header"],
                delivery_header=options["delivery_header"],
                event_header=options["event_header"],
            )
        except sources.InvalidSource as exc:
            raise CommandError(str(exc)) from None
        described = describe(source)
        if options["json"]:
            self.stdout.write(json.dumps(described))
            return
        self.stdout.write(
            self._text({**described, "where": signatures.described(source)})
        )

    def _text(self, described):
        where = described["where"]
        lines = [
            f"Created webhook source {described['slug']} ({described['scheme']}).",
            f"  Deliveries: POST {described['path']}",
            f"  Headers:    signature {where['signature']}, delivery id "
            f"{where['delivery']}, event {where['event']}",
        ]
        for route in described["routes"]:
            assignee = f", assigned to {route['assignee']}" if route["assignee"] else ""
            if route["priority"] is not None:
                assignee += f", priority {route['priority']}"
            if route["group_template"]:
                assignee += f", group {route['group_template']}"
            lines.append(
                f"  Route:      {route['endpoint_name']} "
                f"({route['endpoint_id']}) → queue {route['queue']}{assignee}"
            )
        return "\n".join(lines)


def describe(source):
    """Return a source and its routes as JSON-ready data; never the secret."""
    signature, delivery, event = signatures.headers_of(source)
    return {
        "source_id": str(source.id),
        "slug": source.slug,
        "scheme": source.scheme,
        "path": f"/hooks/{source.slug}",
        "signature_header": signature,
        "delivery_header": delivery,
        "event_header": event,
        # Stripe and Standard Webhooks: stale and replayed deliveries are refused.
        "timestamped": signatures.SCHEMES[source.scheme].timestamped,
        "routes": [
            {
                "route_id": route.id,
                "endpoint_id": str(route.endpoint_id),
                "endpoint_name": route.endpoint.name,
                "queue": route.queue,
                "assignee": route.assignee,
                "title_template": route.title_template,
                "priority": route.priority,
                "group_template": route.group_template,
            }
            for route in source.routes.select_related("endpoint")
        ],
    }
