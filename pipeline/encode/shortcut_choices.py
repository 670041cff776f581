"""Which shortcuts a build takes (the line cache, one render per conversation) and which cached sources a
shortcut made that a check has since refused: decided by the build's process before it tokenizes
(pipeline/encode/source_caches.py, pipeline/orchestrate/build.py), each with the reason it logs."""

from __future__ import annotations

from pathlib import Path

from packtrain.pipeline.encode.fast import encoder_decision
from packtrain.pipeline.encode.fast.exactness import Refusals, line_cache_refusals, render_once_refusals
from packtrain.pipeline.encode.tokenizer_info import TokenizerInfo
from packtrain.pipeline.format import chat_once
from packtrain.pipeline.pack.spill import read_source_stats

FAST_ENCODER_NOTES = ".fast-encoder"  # in the cache directory: remembered encoder decisions, one file per tokenizer,
# shared by every expert built there (the key is the tokenizer's content and the libraries' versions)


def render_once_choice(config, tokenizer: TokenizerInfo, refusals: Refusals) -> tuple[bool, str]:
    """(render conversations once?, why): conversations, the config allows it, the template renders its
    probe conversations once as the exact way does, and no earlier build's check found a difference."""
    if config.format.messages is None:
        return False, "no conversations (format.messages)"
    if not config.build.render_once:
        return False, "build.render_once is false"
    if config.format.each_assistant_turn:
        return False, "format.each_assistant_turn renders each turn on its own"
    if chat_once.turn_end(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token) is None:
        return False, "the chat template does not render its probe conversations once as it does turn by turn"
    refused = refusals.refused()
    if refused is not None:
        return False, f"an earlier build's check found a difference: {refused}"
    return True, "the template renders its probe conversations once as it does turn by turn; checked"


def line_cache_choice(wanted: bool, tokenizer: TokenizerInfo, refusals: Refusals) -> tuple[bool, str]:
    """(use the line cache?, why): the config allows it, the tokenizer has a cut, and no earlier
    build's check found a difference with this tokenizer."""
    if not wanted:
        return False, "build.line_cache is false"
    exact, why = tokenizer.line_split()
    if not exact:
        return False, why
    refused = refusals.refused()
    if refused is not None:
        return False, f"an earlier build's check found a difference: {refused}"
    return True, why


def refused_shortcut_sources(config, source_dirs: list[Path], indices: list[int], cache_dir: Path,
                             tokenizer: TokenizerInfo, log=print) -> list[int]:
    """Of the cached sources ``indices``, those whose documents a shortcut made that a check has since
    refused for this tokenizer (in another build, another expert, or a part made elsewhere): their
    tokens are not trusted, and the caller tokenizes them again (``log`` says so)."""
    content, tokenizer_json = tokenizer.fingerprint["hash"], tokenizer.fingerprint["files"]["tokenizer.json"]
    fast = encoder_decision.refused(Path(cache_dir) / FAST_ENCODER_NOTES, tokenizer_json, config.build.fast_encoder)
    line = line_cache_refusals(Path(cache_dir), content).refused() is not None
    once = render_once_refusals(Path(cache_dir), tokenizer.chat_template).refused() is not None
    if not (fast or line or once):
        return []
    out = []
    for i in indices:
        made = read_source_stats(source_dirs[i]).exactness
        fast_made = set(made.encoder.split("+")) - {"tokenizers"}
        by = (f"the fast encoder ({'+'.join(sorted(fast_made))})" if fast and fast_made else
              "the line cache" if line and made.line_cache else
              "one render per conversation" if once and made.render_once else None)
        if made.by_shortcut and by is not None:
            log(f"source {config.sources[i].name}: its cached tokens were made with {by}, which a check has since "
                "found inexact for this tokenizer: tokenizing it again")
            out.append(i)
    return out
