"""The validator that refuses an event's inputs by name before its handler runs, and the one way
to wire such an event (:func:`checked_event`).

A refused input must not look like a crash: Gradio marks every output of an event whose
handler (or an input's own preprocessing) raised as failed, with a red "Error" over each. An
event's validator instead runs first and, on a refusal, puts one message under the input to
change and leaves every output as it was. So a checked event is wired with Gradio's
``preprocess=False`` (its public listener option): a number out of range or an unknown choice
reaches the validator as it came, which refuses it by name from the component's own range or
choices; the handler then reads each value through the event's check (which returns it as a
number of the right kind), never through the component.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
from collections import OrderedDict

import gradio as gr

from tev.service.service import UserInputError, check_number
from ui import shared

__all__ = ["checked_event", "validator", "refusal", "refusal_line", "once_per_click", "settings_handler", "KEEP_TYPED", "KEEP_TYPED_NUMBERS_JS", "PURGE_DETACHED_PLOTS_JS", "PAGE_JS"]

# Gradio's slider clamps a number typed into its box to the slider's range when the box loses focus
# (top-p 1.7 became 1 and ran without a word). The page's own script (``launch(js=...)``) stops that
# blur for an out-of-range number in a slider inside ``.tev-keep-typed``, so the value stays as typed
# and the event's validator refuses it by name. Only where a refusal line says so (Gradio shows no
# validator message under a slider): elsewhere the clamp stays.
KEEP_TYPED = "tev-keep-typed"
KEEP_TYPED_NUMBERS_JS = """() => {
    window.addEventListener("blur", (event) => {
        const box = event.target;
        if (!(box instanceof HTMLInputElement) || box.type !== "number" || !box.closest(".%s")) return;
        if (!(box.getAttribute("aria-label") || "").startsWith("number input for ")) return;  // a slider's number box
        const value = box.valueAsNumber;
        if (value < parseFloat(box.min) || value > parseFloat(box.max)) event.stopImmediatePropagation();
    }, true);
}""" % KEEP_TYPED

# Gradio's plot component draws each new figure into a fresh plotly element and drops the old one from the page
# without plotly's purge, so the window's resize handlers that plotly added keep every old figure alive: each Live
# run left about 3,500 detached DOM nodes and 1.3-1.5 MB of heap after collection (measured on the quick pair,
# 8 runs). The page's script purges a plotly figure once it has left the page (what plotly's own purge is for);
# then the heap grew about 0.15 MB a run and the DOM stayed flat.
PURGE_DETACHED_PLOTS_JS = """() => {
    new MutationObserver((records) => {
        if (!window.Plotly) return;
        for (const record of records) for (const node of record.removedNodes) {
            if (!(node instanceof Element)) continue;
            const plots = node.classList.contains("js-plotly-plot") ? [node] : node.querySelectorAll(".js-plotly-plot");
            for (const plot of plots) if (!plot.isConnected) window.Plotly.purge(plot);
        }
    }).observe(document.body, {childList: true, subtree: true});
}"""
# The page's own script (``launch(js=...)``): both of the above.
PAGE_JS = "() => { (%s)(); (%s)(); }" % (KEEP_TYPED_NUMBERS_JS, PURGE_DETACHED_PLOTS_JS)


def _short_label(component) -> str:
    """An input named by its label's first words ("budget B (…)" -> "budget B")."""
    return str(component.label).split(" (")[0].split(" ·")[0]


def refusal(component, value, also=None) -> str | None:
    """What is wrong with ``value`` for ``component`` by the component's own range (a Slider or a
    Number) or choices (a Radio; ``also(value)`` passes values a session's own choices may add, for
    the event's check to decide on), or None when nothing is (or the component sets no limit)."""
    try:
        if isinstance(component, gr.Radio):
            choices = [choice for _, choice in component.choices]
            if value not in choices and not (also and also(value)):
                raise UserInputError(f"{_short_label(component)} must be one of {', '.join(map(str, choices))}, got {value!r}")
        elif isinstance(component, (gr.Slider, gr.Number)):
            whole = getattr(component, "precision", None) == 0 or (getattr(component, "step", None) == 1 and float(component.minimum or 0).is_integer())
            low, high = (-math.inf if component.minimum is None else component.minimum), (math.inf if component.maximum is None else component.maximum)
            check_number(_short_label(component), value, low, high, integer=whole)
    except UserInputError as error:
        return str(error)
    return None


def _first_refusal(inputs: list, check=None, also: dict | None = None):
    """``refused(*values)``: ``(index, message)`` of the first input of ``inputs`` refused (by its own range
    or choices, then by ``check``), or None when none is; what :func:`validator` and :func:`refusal_line`
    both say."""
    names = list(inspect.signature(check).parameters)[: len(inputs)] if check else []
    shown = next((i for i, component in enumerate(inputs) if getattr(component, "visible", True) is not False), 0)
    also = also or {}

    def named(error: ValueError) -> int:
        field = getattr(error, "field", None)
        if field in names:  # the check said which input (UserInputError.field)
            return names.index(field)
        message = str(error)  # else the first input whose name the message words
        found = [(message.find(word), i) for i, name in enumerate(names) for word in (name.replace("_", " "), name.replace("_", "-")) if word in message]
        return min(found)[1] if found else shown

    def refused(*values):
        for i, (component, value) in enumerate(zip(inputs, values)):
            wrong = refusal(component, value, also.get(component))
            if wrong is not None:
                return i, wrong
        if check is not None:
            try:
                check(*values)
            except ValueError as error:  # the user's input, or models that could not be loaded: said where to look
                return named(error), str(error)
        return None

    return refused


def validator(inputs: list, check=None, also: dict | None = None):
    """An event's validator (``validator=`` of a Gradio listener) for ``inputs``: each input's own
    range or choices (:func:`refusal`; ``also`` maps a Radio to the values it may also pass), then
    ``check(*values)``, a function with the handler's parameters that raises ``ValueError`` saying
    what to change. The message goes under the input of the error's ``field`` (:class:`UserInputError`), else
    under the one it names first (a parameter name, with ``_`` read as a space or a hyphen: ``top_p`` is
    "top-p"), else under the first visible input; the
    handler then does not run and no output changes."""
    refused = _first_refusal(inputs, check, also)

    def validate(*values):
        verdicts = [gr.validate(True, "") for _ in inputs]
        found = refused(*values)
        if found is not None:
            verdicts[found[0]] = gr.validate(False, found[1])
        return verdicts

    return validate


def refusal_line(inputs: list, check=None, also: dict | None = None):
    """A handler chained before a checked event on the same press: the validator's message as one
    line (a Markdown output) where the user pressed (the validator's message sits under the input it
    names, maybe out of sight, and under a slider not at all), or the line hidden when nothing is
    refused. Chained before, not beside: an event on the same inputs that ends after the validator's
    refusal clears the validator's message."""
    refused = _first_refusal(inputs, check, also)

    def line(*values):
        found = refused(*values)
        return gr.update(value="", visible=False) if found is None else gr.update(value=f"**Not run:** {found[1]}", visible=True)

    return line


def settings_handler(settings_type, handler, more: tuple[str, ...] = (), request: bool = True, name: str | None = None):
    """``handler(settings, *more_values[, request=...])`` as a Gradio handler: one parameter per field of the
    dataclass ``settings_type`` (Gradio names the event's API parameters from the handler's signature, so the API
    keeps the fields' names and a value may be sent by name), then the inputs named in ``more`` (a session's
    state), then, with ``request``, the request (Gradio passes it by its annotation). The settings are written
    once, in ``settings_type``; a generator ``handler`` stays a generator (Gradio streams it). ``name``: the
    handler's name in Gradio's messages (default: ``handler``'s)."""
    names = [field.name for field in dataclasses.fields(settings_type)]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter(name, kind, default=default) for name, default in settings_type.defaults().items()]
    parameters += [inspect.Parameter(name, kind, default=None) for name in more]
    if request:
        parameters.append(inspect.Parameter("request", kind, default=None, annotation=gr.Request))
    signature = inspect.Signature(parameters)

    def split(args, kwargs) -> tuple:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        return settings_type(**{name: given[name] for name in names}), [given[name] for name in more], ({"request": given["request"]} if request else {})

    if inspect.isgeneratorfunction(handler):
        def called(*args, **kwargs):
            settings, extra, named = split(args, kwargs)
            return (yield from handler(settings, *extra, **named))
    else:
        def called(*args, **kwargs):
            settings, extra, named = split(args, kwargs)
            return handler(settings, *extra, **named)

    called.__signature__ = signature
    called.__annotations__ = {"request": gr.Request} if request else {}
    called.__name__ = called.__qualname__ = name or handler.__name__
    called.__doc__ = handler.__doc__
    return called


def checked_event(listener, handler, inputs: list, outputs, check=None, also: dict | None = None, **options):
    """``listener(handler, inputs, outputs, **options)`` with :func:`validator` refusing bad inputs
    by name first, and Gradio's preprocessing off (values come as sent; ``check`` reads them)."""
    return listener(handler, inputs, outputs, validator=validator(inputs, check, also), preprocess=False, **options)


def once_per_click(check):
    """``check`` remembered for its last few distinct inputs, so the handler that calls it after
    the event's validator did reuses that result: one click checks (and tokenizes) once. The
    memory is keyed by the shared service too (a result holds what its models made); values the
    check cannot hash (a session's state) are left out of the key, so ``check`` must not read them;
    a refusal (an exception) is never remembered."""
    remembered: OrderedDict = OrderedDict()
    lock = threading.Lock()

    def key_of(args, kwargs) -> tuple:
        def hashable(value):
            try:
                hash(value)
            except TypeError:
                return None
            return (type(value).__name__, value)

        return (id(shared.SERVICE), *map(hashable, args), *sorted((k, hashable(v)) for k, v in kwargs.items()))

    def remembering(*args, **kwargs):
        key = key_of(args, kwargs)
        with lock:
            found = remembered.get(key)
        if found is not None and found[0] is shared.SERVICE:
            return found[1]
        result = check(*args, **kwargs)
        with lock:
            remembered[key] = (shared.SERVICE, result)
            while len(remembered) > ONCE_KEPT:
                remembered.popitem(last=False)
        return result

    remembering.__signature__ = inspect.signature(check)  # the validator names inputs by the check's parameters
    remembering.__name__, remembering.__doc__ = check.__name__, check.__doc__
    return remembering


ONCE_KEPT = 64  # checks remembered (a few clicks' worth; each result is a prompt's token ids and its settings)
