"""How the Board's forms render: Django's templates, with help text as text."""

from django.forms.renderers import TemplatesSetting


class BoardRenderer(TemplatesSetting):
    """Django's form templates, through the project's template engine, with a
    field's help text escaped (``board/field.html``).

    Django's own field template marks help text safe; on the Board an answer
    form's help text is an agent's ``description`` (CONTRACT §16), so it is
    shown as text, as every other string is.
    """

    field_template_name = "board/field.html"
