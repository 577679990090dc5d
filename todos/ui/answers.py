"""The answer form of a question, built from what the agent asked for.

A question with ``choices`` is answered with one button per choice, all alike;
the chosen one is sent only once confirmed, in a second step of the form
(``awaits_confirmation``), so it needs no script. With an ``answer_schema`` the
form has a field per property of an object schema, in the order the agent
gave them (strings, numbers, integers, booleans and enums as their own inputs,
anything else as JSON), required ones marked and each with its description and
bounds as help text; or one field for a schema of a single value; a schema this
cannot lay out, or none at all with free text allowed, gets one text box
(JSON when there is a schema). Every string of the schema is the agent's: it
is shown as text (``board/field.html``). The posted form becomes the answer's
JSON value, checked against the schema here (the store's bounded check) so
that every failing field shows its own error; the store checks it again when
it stores the answer.
"""

import json

from django import forms
from django.core.exceptions import ValidationError

from todos import store
from todos.ui.forms import BoardForm
from todos.web import http

# The field a single-value answer (no object schema) is posted in.
VALUE = "answer"
# The field that says a choice was confirmed (every choice is, before it is sent).
CONFIRM = "confirm"
SIMPLE_TYPES = ("string", "integer", "number", "boolean")


def _schema(todo):
    return (todo.question or {}).get("answer_schema")


def _choices(todo):
    return (todo.question or {}).get("choices")


def _fields_of(schema):
    """Return the laid-out properties of an object schema, or None when the
    schema is not a plain object of properties."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return None
    if any(not isinstance(name, str) or not name.isidentifier() for name in properties):
        return None
    return properties


JSON_HINT = "JSON: a string in double quotes, a number, a list…"


class JsonField(forms.CharField):
    """A field whose text is read as a JSON value (arrays, objects, anything)."""


def _json_field(label, required, help_text=""):
    return JsonField(
        label=label,
        required=required,
        help_text=" · ".join(filter(None, [help_text, JSON_HINT])),
        widget=forms.Textarea(attrs={"rows": 3}),
    )


def _number(schema, key):
    value = schema.get(key)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return value if is_number else None


def _range(low, high, unit=""):
    if low is not None and high is not None:
        return f"{low} to {high}{unit}"
    if low is not None:
        return f"at least {low}{unit}"
    if high is not None:
        return f"at most {high}{unit}"
    return None


def bounds(schema):
    """The limits a schema puts on one value, as a person reads them."""
    parts = [
        _range(_number(schema, "minimum"), _number(schema, "maximum")),
        _range(
            _number(schema, "minLength"), _number(schema, "maxLength"), " characters"
        ),
        _range(_number(schema, "minItems"), _number(schema, "maxItems"), " items"),
    ]
    if _number(schema, "exclusiveMinimum") is not None:
        parts.append(f"more than {schema['exclusiveMinimum']}")
    if _number(schema, "exclusiveMaximum") is not None:
        parts.append(f"less than {schema['exclusiveMaximum']}")
    if _number(schema, "multipleOf") is not None:
        parts.append(f"a multiple of {schema['multipleOf']}")
    if isinstance(schema.get("pattern"), str):
        parts.append(f"matching {schema['pattern']}")
    if isinstance(schema.get("format"), str):
        parts.append(f"format: {schema['format']}")
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        shown = ", ".join(v if isinstance(v, str) else json.dumps(v) for v in enum[:10])
        parts.append(f"one of: {shown}{' …' if len(enum) > 10 else ''}")
    return " · ".join(part for part in parts if part)


def _field_for(name, schema, required):
    """A form field for one property (or the whole answer) of a schema: its
    help text is the agent's description, then the schema's bounds (text,
    never markup: board/field.html)."""
    schema = schema if isinstance(schema, dict) else {}
    label = schema.get("title") or name.replace("_", " ").capitalize()
    description = schema.get("description")
    help_text = " · ".join(
        filter(
            None, [description if isinstance(description, str) else "", bounds(schema)]
        )
    )
    if isinstance(schema.get("enum"), list) and all(
        isinstance(value, str | int | float | bool) for value in schema["enum"]
    ):
        options = [("", "—")] if not required else []
        options += [(json.dumps(value), str(value)) for value in schema["enum"]]
        return forms.ChoiceField(
            label=label, required=required, choices=options, help_text=help_text
        )
    kind = schema.get("type")
    if kind == "boolean":
        return forms.BooleanField(label=label, required=False, help_text=help_text)
    if kind == "integer":
        return forms.IntegerField(label=label, required=required, help_text=help_text)
    if kind == "number":
        return forms.FloatField(label=label, required=required, help_text=help_text)
    if kind == "string":
        long = schema.get("maxLength") is None or schema["maxLength"] > 200
        widget = forms.Textarea(attrs={"rows": 3}) if long else forms.TextInput
        return forms.CharField(
            label=label,
            required=required,
            strip=False,
            help_text=help_text,
            widget=widget,
        )
    return _json_field(label, required, help_text)


def _ordered(todo, properties, required):
    """The properties in the order the agent wrote them (kept by the store);
    for a question stored without that order, the required ones first."""
    order = (todo.question or {}).get(store.PROPERTY_ORDER)
    if isinstance(order, list) and sorted(order) == sorted(properties):
        return order
    return sorted(properties, key=lambda name: name not in required)


def _parse_json(text):
    try:
        return http.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    except (ValueError, RecursionError) as exc:
        detail = str(exc) if isinstance(exc, ValueError) else "nested too deep"
        raise ValidationError(f"Not valid JSON: {detail}.") from None


class AnswerForm(BoardForm):
    """The answer to one todo's question; ``answer()`` is its JSON value."""

    def __init__(self, todo, *args, **kwargs):
        kwargs.setdefault("prefix", f"q{todo.id.split('-')[0]}")
        super().__init__(*args, **kwargs)
        self.todo = todo
        self.choices = _choices(todo)
        schema = _schema(todo)
        self.properties = None if self.choices else _fields_of(schema)
        if self.choices:
            # One button per choice: the button posts it as the value. The
            # choice is sent once confirmed (the card's second step).
            self.fields[VALUE] = forms.ChoiceField(
                choices=[(choice, choice) for choice in self.choices],
                widget=forms.HiddenInput,
            )
            self.fields[CONFIRM] = forms.BooleanField(
                required=False, widget=forms.HiddenInput
            )
        elif self.properties is not None:
            required = set(schema.get("required") or ())
            for name in _ordered(todo, self.properties, required):
                field = _field_for(name, self.properties[name], name in required)
                if field.required:
                    field.label_suffix = " (required)"
                self.fields[name] = field
        elif schema is not None and schema.get("type") in SIMPLE_TYPES:
            self.fields[VALUE] = _field_for("answer", schema, True)
            self.fields[VALUE].label = "Answer"
        elif schema is not None:
            self.fields[VALUE] = _json_field(
                "Answer", True, "Matching the schema below."
            )
        else:
            self.fields[VALUE] = forms.CharField(
                label="Answer",
                strip=False,
                widget=forms.Textarea(attrs={"rows": 3}),
            )
        self.json_fields = {
            name for name, field in self.fields.items() if isinstance(field, JsonField)
        }

    @property
    def awaits_confirmation(self):
        """A valid choice not confirmed yet: the card asks before sending it."""
        return self.layout == "choices" and not self.cleaned_data.get(CONFIRM)

    @property
    def chosen(self):
        """The choice being confirmed."""
        return self.cleaned_data.get(VALUE)

    @property
    def layout(self):
        """How the template shows the form: choices, fields, or one value."""
        if self.choices:
            return "choices"
        return "fields" if self.properties is not None else "value"

    def _value_of(self, name):
        value = self.cleaned_data.get(name)
        field = self.fields[name]
        if isinstance(field, forms.ChoiceField) and not self.choices:
            return None if value == "" else json.loads(value)
        if name in self.json_fields:
            return None if value in ("", None) else _parse_json(value)
        if value == "" and not field.required:
            return None
        return value

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            if self.properties is None:
                self.value = self._value_of(VALUE)
            else:
                self.value = {}
                for name in self.properties:
                    value = self._value_of(name)
                    if value is not None or isinstance(
                        self.fields[name], forms.BooleanField
                    ):
                        self.value[name] = value
        except ValidationError as exc:
            self.add_error(VALUE if self.properties is None else name, exc)
            return cleaned
        problem = http.unstorable(self.value)
        if problem:
            self.add_error(None, f"The answer cannot be stored: {problem}.")
            return cleaned
        self._check_schema()
        return cleaned

    def _check_schema(self):
        """Put each schema error on the field it concerns (the whole answer's
        on the form)."""
        schema = _schema(self.todo)
        if schema is None:
            return
        try:
            errors = store.answer_errors(schema, self.value)
        except store.InvalidAnswer as exc:
            self.add_error(None, str(exc))
            return
        for error in errors:
            self.add_invalid(error.absolute_path, error.message)

    def add_invalid(self, path, message):
        """Show an answer error at its path: a field, else the whole form."""
        path = list(path)
        if self.properties is None:
            self.add_error(VALUE if VALUE in self.fields else None, message)
        elif path and path[0] in self.fields and not self.has_error(path[0]):
            self.add_error(path[0], message)
        elif not path:
            self.add_error(None, message)

    def store_error(self, exc):
        """Show the store's InvalidAnswer (or TooLarge) on the form."""
        if isinstance(exc, store.InvalidAnswer):
            parts = exc.path.removeprefix("answer").lstrip(".").split(".")
            message = str(exc).split(": ", 1)[-1]
            self.add_invalid([parts[0]] if parts[0] else [], message)
        else:
            self.add_error(None, str(exc))

    def answer(self):
        return self.value
