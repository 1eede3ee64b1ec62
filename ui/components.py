"""Numeric and choice input components, and the validator that refuses an event's inputs before it runs.

A refused input must not look like a crash: Gradio marks every output of an event whose
handler (or an input's own check) raised as failed, with a red "Error" over each. An event's
validator instead runs first and, on a refusal, puts one message under the input to change and
leaves every output as it was. So the input components here never raise on a bad value (a number
out of range, an unknown choice): they pass it on, and :func:`validator` refuses it by name.
"""

from __future__ import annotations

import inspect

import gradio as gr
import gradio.component_meta

from tev.service.service import UserInputError, check_number

__all__ = ["Slider", "Number", "Radio", "validator"]


class _Checked:
    """An input that checks its own value (:meth:`checked`), named by its label's first words
    ("budget B (…)" -> "budget B")."""

    def _short_label(self) -> str:
        return str(self.label).split(" (")[0].split(" ·")[0]

    def checked(self, value):
        whole = getattr(self, "precision", None) == 0 or (getattr(self, "step", None) == 1 and float(self.minimum or 0).is_integer())
        return check_number(self._short_label(), value, self.minimum, self.maximum, integer=whole)

    def refused(self, payload) -> bool:
        """Whether :meth:`checked` refuses ``payload``: then preprocessing passes it on as it is, for
        the event's validator to refuse by name before the handler runs."""
        try:
            self.checked(payload)
        except UserInputError:
            return True
        return False


# Gradio's component metaclass writes a ``.pyi`` stub beside the module that defines a
# component subclass (a custom-component development aid); the app must not write into its
# own folder (nor fail where that folder is read-only), so the two subclasses are made with
# that writer switched off.
_write_stub = gradio.component_meta.create_or_modify_pyi
gradio.component_meta.create_or_modify_pyi = lambda *args, **kwargs: None
try:
    # gr.Slider first: Gradio picks a subclass's front end from its first base
    class Slider(gr.Slider, _Checked):
        """``gr.Slider`` (same front end) whose bad values :func:`validator` refuses by name."""

        is_template = True

        def preprocess(self, payload):
            return payload if self.refused(payload) else super().preprocess(payload)

    class Number(gr.Number, _Checked):
        """``gr.Number`` (same front end) whose bad values (an empty field included) :func:`validator` refuses by name."""

        is_template = True

        def preprocess(self, payload):
            return payload if self.refused(payload) else super().preprocess(payload)

    class Radio(gr.Radio, _Checked):
        """``gr.Radio`` (same front end) whose unknown choices :func:`validator` refuses by name.
        ``also(value)``, set after construction, passes values a session's own choices may add (the
        event's check decides on them). No ``__init__`` of its own: Gradio sends the page only the
        parameters the component class's own ``__init__`` names, so an override would drop the label and value."""

        is_template = True
        also = None

        def preprocess(self, payload):
            return payload if self.refused(payload) else super().preprocess(payload)

        def checked(self, value):
            choices = [value for _, value in self.choices]
            if value not in choices and not (self.also and self.also(value)):
                raise UserInputError(f"{self._short_label()} must be one of {', '.join(map(str, choices))}, got {value!r}")
            return value
finally:
    gradio.component_meta.create_or_modify_pyi = _write_stub


def validator(inputs: list, check=None):
    """An event's validator (``validator=`` of a Gradio listener) for ``inputs``: each numeric
    input's own range, then ``check(*values)``, a function with the handler's parameters that
    raises ``ValueError`` saying what to change. The message goes under the input it names
    first (a parameter name, with ``_`` read as a space or a hyphen: ``top_p`` is "top-p"),
    else under the first visible input; the handler then does not run and no output changes."""
    names = list(inspect.signature(check).parameters)[: len(inputs)] if check else []
    shown = next((i for i, component in enumerate(inputs) if getattr(component, "visible", True) is not False), 0)

    def named(message: str) -> int:
        found = [(message.find(word), i) for i, name in enumerate(names) for word in (name.replace("_", " "), name.replace("_", "-")) if word in message]
        return min(found)[1] if found else shown

    def validate(*values):
        verdicts = [gr.validate(True, "") for _ in inputs]
        for i, (component, value) in enumerate(zip(inputs, values)):
            if isinstance(component, _Checked):
                try:
                    component.checked(value)
                except UserInputError as error:
                    verdicts[i] = gr.validate(False, str(error))
                    return verdicts
        if check is not None:
            try:
                check(*values)
            except ValueError as error:  # the user's input, or models that could not be loaded: said where to look
                verdicts[named(str(error))] = gr.validate(False, str(error))
        return verdicts

    return validate
