"""Generation sized for a CPU: the end-of-run samples and task eval of ``train`` read at most
``cpu.generate_tokens`` tokens per model (the base model's answers, then the adapter's), counting each
prompt's tokens and the new tokens it may generate. On a loaded 2-core machine a 1,000-token Spider
prompt costs about what a 512-token training step costs forward, so three of them, twice, made a
5-step try mostly samples (docs/BENCHMARKS.md, "A 5-step try on Spider").

- Samples are read, not scored: each of ``n`` prompts gets ``budget // n`` tokens, and a longer prompt
  keeps its end (the question and what leads to the answer), its start left out.
- The task eval scores: a prompt is never cut (that would be another task); prompts are taken in order
  while their tokens fit, the rest skipped.

Either way the log says what was cut or skipped, and how to have it whole.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_PROMPT = 16
"""The fewest prompt tokens a sample keeps: fewer samples are shown rather than cut shorter."""


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    reference_ids: list[int]


def fit_samples(examples: list[Example], budget: int, new_tokens: int) -> tuple[list[Example], str | None]:
    """The samples within ``budget`` tokens per model, and the line saying what was cut (None: nothing)::

        >>> examples = [Example(list(range(100)), [1]), Example(list(range(30)), [2]), Example(list(range(60)), [3])]
        >>> kept, said = fit_samples(examples, 192, 32)
        >>> [len(e.prompt_ids) for e in kept], kept[0].prompt_ids[:2]
        ([32, 30, 32], [68, 69])
        >>> said
        '2 of 3 prompts cut to their last 32 tokens (of 60-100): cpu.generate_tokens 192 a model on a CPU, each prompt 32 new tokens'
        >>> [len(e.prompt_ids) for e in fit_samples(examples, 100, 32)[0]]
        [18, 18]
        >>> fit_samples(examples, 10000, 32)[1] is None
        True
    """
    n = len(examples)
    while n > 1 and budget // n - new_tokens < MIN_PROMPT:
        n -= 1
    keep = max(budget // max(n, 1) - new_tokens, MIN_PROMPT)
    shown = examples[:n]
    cut = [len(e.prompt_ids) for e in shown if len(e.prompt_ids) > keep]
    if not cut and n == len(examples):
        return list(examples), None
    said = [f"{len(cut)} of {n} prompts cut to their last {keep} tokens (of {min(cut)}-{max(cut)})"] if cut else []
    if n < len(examples):
        said.insert(0, f"{n} of {len(examples)} prompts shown")
    return ([Example(e.prompt_ids[-keep:], e.reference_ids) for e in shown],
            ", ".join(said) + f": cpu.generate_tokens {budget} a model on a CPU, each prompt {new_tokens} new tokens")


def fit_task(examples: list[Example], budget: int, new_tokens: int) -> tuple[list[Example], str | None]:
    """The task eval's examples within ``budget`` tokens per model, taken in order, none cut; and the
    line saying how many were skipped (None: none)::

        >>> examples = [Example(list(range(100)), [1]), Example(list(range(30)), [2]), Example(list(range(60)), [3])]
        >>> kept, said = fit_task(examples, 300, 64)
        >>> [len(e.prompt_ids) for e in kept], said
        ([100, 30], '2 of 3 prompts fit cpu.generate_tokens 300 a model on a CPU (prompt + 64 new tokens each); 1 skipped')
    """
    kept, used = [], 0
    for e in examples:
        if used + len(e.prompt_ids) + new_tokens > budget:
            break
        kept.append(e)
        used += len(e.prompt_ids) + new_tokens
    if len(kept) == len(examples):
        return kept, None
    return kept, (f"{len(kept)} of {len(examples)} prompts fit cpu.generate_tokens {budget} a model on a CPU "
                  f"(prompt + {new_tokens} new tokens each); {len(examples) - len(kept)} skipped")
