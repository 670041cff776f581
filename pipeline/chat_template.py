"""Chat templates compiled the way transformers compiles them, and the error a row that cannot
become a training document raises (:class:`BadRow`, also what a template's ``raise_exception`` raises)."""

from __future__ import annotations

import json
from functools import lru_cache


class BadRow(ValueError):
    """A row that cannot become a training document; the message says why."""


@lru_cache(maxsize=4)
def compile_chat_template(template: str):
    """Compile a chat template the way transformers does (sandboxed Jinja, trim/lstrip blocks)."""
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationMarkers(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask markers) renders its
        body: the spans are found by rendering prefixes, with or without the markers."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message: str):
        raise BadRow(f"chat template: {message}")

    def tojson(value, indent=None, ensure_ascii=False):
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, GenerationMarkers])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
