"""Django's template backend, less the reference cycle each render leaves.

``make_context`` pushes the view's context onto a ``RequestContext`` and never
pops it; a pushed ``ContextDict`` and its context refer to each other, so every
rendered page left its whole context (the Board overview: each row, endpoint
and owner) for the garbage collector. In a served process beside thousands of
waiters those young collections took 25-120 ms with the event loop stopped
(docs/scaling.md, "Garbage collection"). Here a render lets go of its context
when it ends: the page is a string by then. A form in the context is another
such cycle (its bound fields refer to it, and it keeps them); its bound fields
are let go too, and made anew if the form is used again.
"""

from typing import Any

from django.forms import BaseForm
from django.http import HttpRequest
from django.template.backends import django as backend
from django.template.context import Context, make_context
from django.template.exceptions import TemplateDoesNotExist


class Template(backend.Template):
    def render(
        self,
        context: dict[str, Any] | None = None,  # as Django's backend types it
        request: HttpRequest | None = None,
    ) -> str:
        made = make_context(context, request, autoescape=self.backend.engine.autoescape)
        try:
            return self.template.render(made)
        except TemplateDoesNotExist as exc:
            backend.reraise(exc, self.backend)
        finally:
            let_go(made)


def let_go(context: Context) -> None:
    for values in context.dicts:
        for value in values.values():
            if isinstance(value, BaseForm):
                value._bound_fields_cache.clear()  # type: ignore[attr-defined]  # BaseForm's, not in its stubs
    # The context's dicts hold the ContextDicts that hold the context.
    context.dicts.clear()


class DjangoTemplates(backend.DjangoTemplates):
    def from_string(self, template_code: str) -> Template:
        return Template(super().from_string(template_code).template, self)

    def get_template(self, template_name: str) -> Template:
        return Template(super().get_template(template_name).template, self)
