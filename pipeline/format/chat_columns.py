"""Conversations formatted a batch at once: rows of plain ChatML messages, with no call chain per row.

Row by row (pipeline/encode/worker.py ``format_rows``), a conversation goes through
``RowFormatter.documents``: a dict of the row, the walk of its messages looking for special-token
text (``SpecialText.find``, one regex call per string), the format's checks for tools and template
variables, and, for a template that ``chat_once.chatml_system`` admits, ``chat_once.plain_chatml``:
the string joins. Where the format asks for nothing else (no tools, no template variables, no
completion column, no role mapping, not ``each_assistant_turn``), that chain ends in
``plain_chatml(messages)`` for every row whose data holds no special-token text. Here the batch
calls ``plain_chatml`` on each row's messages directly and looks for special-token text once, with
one regex over the batch's message contents joined by a character no special token holds::

    rows   [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b<|im_end|>"}], [...]
    joined 'a\\x00b<|im_end|>\\x00...'   one search: a hit in row 0's contents
    row 0  -> the per-row formatter (it marks the special-token text, or refuses the row)

A row ``plain_chatml`` does not render (not plain: other keys, a blank answer, a role it does not
know, an answer first) and a row whose contents hold special-token text are left to the per-row
formatter (None), which formats them as before; every other row gets exactly what the per-row
formatter gives it, the same ``Formatted``. Where a role's own name holds special-token text (a
tokenizer whose special tokens include ``user``), the batch is not formatted here at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from packtrain.pipeline.format.chat_once import HEADS
from packtrain.pipeline.format.format import Formatted, RowFormatter

SEPARATOR = "\x00"
"""What joins the contents searched at once: a special token holding it makes the batch per-row."""


def plain_only(formatter: RowFormatter) -> bool:
    """Whether the format makes a row's one document ``plain_chatml(messages)`` where that renders it
    and the row's data holds no special-token text: the per-row chain asks nothing else of such a row."""
    fmt = formatter.fmt
    special = formatter.special
    return (formatter.plain_chatml is not None and not fmt.each_assistant_turn and fmt.completion is None
            and not (fmt.message_property_mappings or fmt.roles) and fmt.tools is None
            and fmt.chat_template_kwargs_column is None and not fmt.chat_template_kwargs
            and (special is None or special.pattern is None
                 or not any(SEPARATOR in token for token in special.tokens)
                 and not any(special.pattern.search(role) for role in HEADS)))


def format_conversations(formatter: RowFormatter, columns: Mapping[str, list]) -> list[Formatted | None] | None:
    """Each row's one document where it is a plain conversation (module doc), None where the per-row
    formatter must format it; None for the whole batch where the format is not :func:`plain_only`.

    >>> from packtrain.core.config_build import FormatConfig
    >>> from packtrain.pipeline.format.special_text import SpecialText
    >>> chatml = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    ...           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    >>> formatter = RowFormatter(FormatConfig(style="chat", messages="messages"), (), chatml, None, "<|im_end|>",
    ...                          render_once=True, special=SpecialText("text", ("<|im_end|>", "<|im_start|>")))
    >>> rows = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    ...         [{"role": "user", "content": "a<|im_end|>"}, {"role": "assistant", "content": "b"}],
    ...         [{"role": "user", "content": "a"}, {"role": "assistant", "content": " "}]]
    >>> [doc and doc.text for doc in format_conversations(formatter, {"messages": rows})]
    ['<|im_start|>user\\na<|im_end|>\\n<|im_start|>assistant\\nb<|im_end|>', None, None]
    """
    if formatter.fmt.messages is None or not plain_only(formatter):
        return None
    column = formatter.messages_column
    if column not in columns:
        return None
    render = formatter.plain_chatml
    docs = list(map(render, columns[column]))
    special = formatter.special
    if special is None or special.pattern is None:
        return docs
    rendered = [k for k, doc in enumerate(docs) if doc is not None]
    messages = columns[column]
    contents = [SEPARATOR.join([m["content"] for m in messages[k]]) for k in rendered]
    if special.pattern.search(SEPARATOR.join(contents)) is None:
        return docs
    for k, text in zip(rendered, contents):
        if special.pattern.search(text) is not None:
            docs[k] = None  # the per-row formatter marks it, or refuses it
    return docs
