"""The Board's SQS section of an endpoint: its key id and account, issue/rotate.

The secret access key is shown once, in the response that issues it, like an
endpoint token; afterwards only the key id and the account id are shown.
"""

from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from todos.sqs import credentials
from todos.ui.core import _endpoint_missing, _endpoint_or_none, operator_view


@require_http_methods(["GET", "POST"])
@operator_view
def endpoint_sqs(request, endpoint_id):
    """Show an endpoint's SQS credentials (GET) or issue new ones (POST)."""
    endpoint = _endpoint_or_none(request, endpoint_id)
    if endpoint is None:
        return _endpoint_missing(request)
    issued = None
    if request.method == "POST" and endpoint.is_active:
        issued = credentials.issue(endpoint)
    response = render(
        request,
        "board/endpoint_sqs.html",
        {
            "nav": "endpoints",
            "endpoint": endpoint,
            "credential": credentials.shown(endpoint),
            "issued": issued,
            "endpoint_url": f"{request.scheme}://{request.get_host()}",
        },
    )
    if issued is not None:
        # The secret exists only in this response: keep it out of every cache.
        response["Cache-Control"] = "no-store"
    return response
