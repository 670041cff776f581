"""Answers from a finished run, one prompt at a time, streamed as they generate (``packtrain generate``
and ``packtrain chat``).

The prompt text comes from the CLI, made by the run's own format (packtrain.pipeline.format.generation_prompt);
here it is tokenized the way the build tokenizes (no special tokens added, the format's prefix ids
first), so the model sees what it trained on. Greedy by default; ``temperature > 0`` samples (with
``top_p``, seeded). ``base=True`` answers with the adapter disabled: the base model.

The model's context (``max_position_embeddings``) bounds prompt and answer together: a prompt that
fills it is refused (:class:`PromptTooLong`, one line, before any forward pass: a 125 kB prompt ran
108 s on a 4,096-position model without a word, issue 46); one that leaves less room than
``max_new_tokens`` gets the room left, said in one line.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from packtrain.core.errors import PacktrainError
from packtrain.trainer.model.attention import reference_attention_for_generation
from packtrain.trainer.eval.eval_run import OpenRun
from packtrain.trainer.eval.generate import until_eos
from packtrain.trainer.model.model import causal_lm, context_length


class PromptTooLong(PacktrainError):
    """The prompt leaves the model no position to answer in; the message says how long it is and the
    context."""


def new_tokens_room(prompt_tokens: int, max_new_tokens: int, context: int | None,
                    field: str = "max_position_embeddings") -> tuple[int, str | None]:
    """(how many tokens to generate, the line that says it is fewer than asked or None); a prompt that
    leaves no room raises :class:`PromptTooLong`. ``field``: the model config's field that says ``context``.

    >>> new_tokens_room(100, 256, 4096)
    (256, None)
    >>> new_tokens_room(4000, 256, 4096)[1]
    "the prompt is 4,000 tokens: 96 new tokens fit the model's context of 4,096 positions (max_position_embeddings), not --max-new-tokens 256; the answer stops there"
    >>> new_tokens_room(5000, 256, 4096)
    Traceback (most recent call last):
    ...
    packtrain.trainer.eval.talk.PromptTooLong: the prompt is 5,000 tokens, and the model's context is 4,096 positions (max_position_embeddings): it leaves no room for an answer, so it is refused; shorten it to under 4,096 tokens
    """
    if context is None or prompt_tokens + max_new_tokens <= context:
        return max_new_tokens, None
    if prompt_tokens >= context:
        raise PromptTooLong(f"the prompt is {prompt_tokens:,} tokens, and the model's context is {context:,} positions "
                            f"({field}): it leaves no room for an answer, so it is refused; shorten it "
                            f"to under {context:,} tokens")
    room = context - prompt_tokens
    return room, (f"the prompt is {prompt_tokens:,} tokens: {room:,} new tokens fit the model's context of {context:,} "
                  f"positions ({field}), not --max-new-tokens {max_new_tokens:,}; the answer stops there")


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0


def prompt_ids(tokenizer, text: str, prefix_ids: Sequence[int] = ()) -> list[int]:
    """A prompt's token ids as the build makes a document's: the prefix ids, then the text's own ids
    (no special tokens added: the chat template wrote them as text)."""
    return [*prefix_ids, *tokenizer.encode(text, add_special_tokens=False).ids]


class TextStream:
    """A transformers streamer that hands ``on_text`` each new piece of decoded text (the prompt, which
    ``generate`` puts first, skipped; a piece that ends inside a UTF-8 character waits for the rest)."""

    def __init__(self, decode: Callable[[list[int]], str], eos_id: int, on_text: Callable[[str], None]):
        self.decode, self.eos_id, self.on_text = decode, eos_id, on_text
        self.ids: list[int] = []
        self.shown = ""
        self.prompt_seen = False
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            if self.ended or token == self.eos_id:
                self.ended = True
                return
            self.ids.append(token)
        text = self.decode(self.ids)
        if not text.endswith("\ufffd"):
            self._show(text)

    def end(self) -> None:
        self._show(self.decode(self.ids))

    def _show(self, text: str) -> None:
        """Hand on what ``text`` adds to what was shown already."""
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.on_text(text[len(self.shown):])
            self.shown = text


class Talker:
    """Replies of a loaded run (:func:`packtrain.trainer.eval.eval_run.open_run`) to prompt texts."""

    def __init__(self, run: OpenRun, sampling: Sampling, base: bool = False,
                 on_note: Callable[[str], None] | None = None):
        from tokenizers import Tokenizer

        self.run, self.sampling, self.base = run, sampling, base
        self.on_note = on_note  # the line saying an answer is cut to the context's room
        self.context = context_length(getattr(causal_lm(run.model), "config", None))
        self.tokenizer = Tokenizer.from_file(str(run.tokenizer_dir / "tokenizer.json"))
        self.eos_id = run.manifest.eos_id
        run.model.eval()

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, text: str, prefix_ids: Sequence[int] = ()) -> list[int]:
        return prompt_ids(self.tokenizer, text, prefix_ids)

    @torch.no_grad()
    def reply(self, text: str, prefix_ids: Sequence[int] = (), on_text: Callable[[str], None] | None = None) -> str:
        """The answer to the prompt ``text`` (decoded, up to the eos), streamed to ``on_text`` as it grows.
        A prompt that fills the model's context raises :class:`PromptTooLong`; the answer gets at most
        the positions left (said to ``on_note``)."""
        run, how = self.run, self.sampling
        prompt = self.prompt_ids(text, prefix_ids)
        max_new_tokens, note = new_tokens_room(len(prompt), how.max_new_tokens, *(self.context or (None,)))
        if note is not None and self.on_note is not None:
            self.on_note(note)
        ids = torch.tensor([prompt], device=run.device)
        model = run.model
        off = model.disable_adapter() if self.base and hasattr(model, "disable_adapter") else contextlib.nullcontext()
        sampled = how.temperature > 0
        options = dict(do_sample=True, temperature=how.temperature, top_p=how.top_p) if sampled else \
            dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampled:
            torch.manual_seed(how.seed)
        stream = TextStream(self.decode, self.eos_id, on_text) if on_text is not None else None
        with off, reference_attention_for_generation(causal_lm(model)), run.precision.autocast(run.device):
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 use_cache=True, eos_token_id=self.eos_id, pad_token_id=run.manifest.pad_id,
                                 streamer=stream, **options)
        return self.decode(until_eos(out[0, ids.shape[1]:].tolist(), self.eos_id))
