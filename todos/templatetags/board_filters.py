"""Template filters of the Board's pages."""

from django import template

from todos import store

register = template.Library()


@register.filter
def attempt_cap(value):
    """An attempt cap as the Board shows it: "no cap" for a queue that never stops."""
    return "no cap" if value == store.UNLIMITED_ATTEMPTS else value
