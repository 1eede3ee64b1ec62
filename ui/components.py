"""Numeric input components: Gradio's Slider and Number, refusing non-numbers clearly."""

from __future__ import annotations

import gradio as gr
import gradio.component_meta

from tev.service.service import UserInputError, finite_number
from ui.shared import _user_error


def _finite_number(component, payload):
    """Refuse an API value that is not a finite number (a string, None, NaN, a bool) with a
    clear message; Gradio's own range check (run next) would crash on it with an opaque error."""
    try:
        return finite_number(component.label, payload, component.minimum, component.maximum)
    except UserInputError as error:
        raise _user_error(error) from None


# Gradio's component metaclass writes a ``.pyi`` stub beside the module that defines a
# component subclass (a custom-component development aid); the app must not write into its
# own folder (nor fail where that folder is read-only), so the two subclasses are made with
# that writer switched off.
_write_stub = gradio.component_meta.create_or_modify_pyi
gradio.component_meta.create_or_modify_pyi = lambda *args, **kwargs: None
try:
    class Slider(gr.Slider):
        """``gr.Slider`` (same front end) whose input check refuses non-numbers clearly."""

        is_template = True

        def preprocess(self, payload):
            return super().preprocess(_finite_number(self, payload))

    class Number(gr.Number):
        """``gr.Number`` (same front end) whose input check refuses non-numbers clearly; an empty
        field (None) goes on to the handler, which names the missing value."""

        is_template = True

        def preprocess(self, payload):
            return super().preprocess(payload if payload is None else _finite_number(self, payload))
finally:
    gradio.component_meta.create_or_modify_pyi = _write_stub
