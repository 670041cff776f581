"""Task evaluation: the adapter's answers to the build's validation prompts, scored per expert.

The validation prompts are the build's val documents themselves: in a document the prompt is what
the loss mask leaves out before the first supervised token, the reference is the first supervised
span (without its eos)::

    input_ids  p p p a a E | q b E | _        (shardfile.py draws the block)
    loss_mask  0 0 0 1 1 1 | 0 1 1 | 0
    examples   prompt [p p p], reference [a a]; prompt [q], reference [b]

A document piece that starts supervised (the tail of a split overlong document) has no prompt and is
skipped. Both are decoded with the build's tokenizer (the model's: train.py checked they match).

For each example the base model (adapter disabled) and the adapter answer greedily
(trainer/eval/generate.py); the metrics are trainer/eval/task_metrics.py's. Written into the run directory:
``eval.jsonl`` (one line per example: prompt, reference, base and adapter answers and scores) and
``eval.json`` (the summary: metric means for the base model and the adapter, counts, settings).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from packtrain.core.errors import PacktrainError
from packtrain.core.config_train import CPU_SAMPLE_MAX_NEW_TOKENS
from packtrain.core.contract import Manifest
from packtrain.core.files import write_atomic, write_new
from packtrain.core.shardfile import open_shard
from packtrain.trainer.eval.generate import Greedy, generate
from packtrain.trainer.model import Precision
from packtrain.trainer.eval.task_metrics import aggregate, metric_for, score

if TYPE_CHECKING:  # the training run's context; `packtrain eval` does without it (eval_run.py)
    from packtrain.trainer.context import TrainContext

log = logging.getLogger("packtrain.train")

EVAL_SUMMARY, EVAL_SAMPLES = "eval.json", "eval.jsonl"


class TaskEvalError(PacktrainError):
    """Task evaluation cannot run; the message says why and what to do."""


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    reference_ids: list[int]


def split_document(tokens, mask, eos_id: int) -> Example | None:
    """(prompt, reference) of one document: the tokens before the first supervised one, and the first
    supervised span without a trailing eos; None without a prompt or a supervised token::

        >>> split_document([7, 8, 9, 5, 6, 0], [0, 0, 0, 1, 1, 1], eos_id=0)
        Example(prompt_ids=[7, 8, 9], reference_ids=[5, 6])
        >>> split_document([5, 6, 0], [1, 1, 1], eos_id=0) is None
        True
    """
    mask = [int(m) for m in mask]
    if 1 not in mask or mask[0] == 1:
        return None
    start = mask.index(1)
    end = mask.index(0, start) if 0 in mask[start:] else len(mask)
    reference = [int(t) for t in tokens[start:end]]
    if reference and reference[-1] == eos_id:
        reference = reference[:-1]
    return Example([int(t) for t in tokens[:start]], reference)


def val_examples(build_dir: Path, manifest: Manifest, limit: int) -> list[Example]:
    """The first ``limit`` examples of the build's val split, in shard order."""
    eos_id = manifest.eos_id
    examples: list[Example] = []
    for shard in manifest.val:
        blocks = open_shard(build_dir / shard.file, manifest.block_size)
        for row in range(len(blocks)):
            ids, mask, doc_lens = blocks.block(row)
            at = 0
            for n in doc_lens.tolist():
                example = split_document(ids[at:at + n], mask[at:at + n], eos_id)
                at += n
                if example is not None:
                    examples.append(example)
                    if len(examples) == limit:
                        return examples
    return examples


def example_limit(configured: int | str, device: torch.device) -> int:
    """``train.task_eval_max_examples``; ``auto``: 200 on CUDA, 16 on CPU."""
    if configured != "auto":
        return int(configured)
    return 200 if device.type == "cuda" else 16


class Answers:
    """Base-model and adapter answers to a list of examples, decoded."""

    def __init__(self, model, tokenizer_dir: Path, manifest: Manifest, device: torch.device, precision: Precision,
                 max_new_tokens: int, batch_size: int):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.model, self.device, self.precision = model, device, precision
        self.eos_id = manifest.eos_id
        self.pad_id = manifest.pad_id
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def answer(self, examples: list[Example], adapter: bool, max_new_tokens: int | None = None,
               what: str = "task eval") -> list[str]:
        """The answers decoded; the console shows ``what`` and the model while they generate."""
        greedy = Greedy(max_new_tokens or self.max_new_tokens, self.batch_size, self.eos_id, self.pad_id, self.device,
                        self.precision)
        generated = generate(self.model, [e.prompt_ids for e in examples], greedy, adapter=adapter,
                             progress=f"{what}, {'adapter' if adapter else 'base model'}")
        return [self.decode(ids) for ids in generated]

    def side_by_side(self, examples: list[Example], max_new_tokens: int | None = None,
                     what: str = "task eval") -> list[dict]:
        """One row per example: prompt, reference, base answer, adapter answer (texts). The prompt keeps
        its special tokens (a chat template's ``<|im_start|>user``...), as ``packtrain inspect`` shows
        the text: what the model was prompted with; the answers and the reference are the texts scored."""
        base = self.answer(examples, adapter=False, max_new_tokens=max_new_tokens, what=what)
        tuned = self.answer(examples, adapter=True, max_new_tokens=max_new_tokens, what=what)
        return [{"prompt": self.tokenizer.decode(e.prompt_ids, skip_special_tokens=False), "reference": self.decode(e.reference_ids), "base": b,
                 "adapter": a} for e, b, a in zip(examples, base, tuned)]


def task_eval(answers: Answers, examples: list[Example], expert: str, metric_setting: str, run_dir: Path) -> dict:
    """Score base and adapter on ``examples``; write ``eval.jsonl`` and ``eval.json`` into ``run_dir``
    (refused when the run has an ``eval.json``: an evaluation is never overwritten); returns the summary.

    ``eval.json`` is written last and is the evaluation's mark of completion: an ``eval.jsonl`` without
    it is what an interrupted evaluation left, and is replaced."""
    check_not_evaluated(run_dir)
    if not examples:
        raise TaskEvalError(f"the build has no validation prompts (val documents with a prompt before the "
                            f"answer): rebuild {expert} with pack.val_fraction > 0")
    metric = metric_for(expert, metric_setting)
    rows = answers.side_by_side(examples)
    for row in rows:
        row["base_scores"] = score(metric, row["base"], row["reference"])
        row["adapter_scores"] = score(metric, row["adapter"], row["reference"])
    summary = {
        "expert": expert, "metric": metric, "examples": len(rows), "max_new_tokens": answers.max_new_tokens,
        "base": aggregate([r["base_scores"] for r in rows]),
        "adapter": aggregate([r["adapter_scores"] for r in rows]),
    }
    if (run_dir / EVAL_SAMPLES).exists():
        log.info("%s has no %s beside it (an interrupted evaluation): replaced", run_dir / EVAL_SAMPLES, EVAL_SUMMARY)
    _write_new(run_dir / EVAL_SAMPLES, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    _write_new(run_dir / EVAL_SUMMARY, json.dumps(summary, indent=2, sort_keys=True) + "\n", replace=False)
    return summary


def check_not_evaluated(run_dir: Path) -> None:
    if (run_dir / EVAL_SUMMARY).exists():
        raise TaskEvalError(f"{run_dir / EVAL_SUMMARY} exists: this run was evaluated already; move it away "
                            "to evaluate again")


def format_summary(summary: dict) -> str:
    """``task eval (sql, 16 examples): exact_match base 0.00 -> adapter 0.50; parses ...``"""
    parts = [f"{key} base {summary['base'][key]:.2f} -> adapter {summary['adapter'][key]:.2f}"
             for key in summary["adapter"]]
    return f"task eval ({summary['metric']}, {summary['examples']} examples): " + "; ".join(parts)


def format_samples(rows: list[dict], width: int = 200) -> str:
    """The side-by-side answers, a few lines per prompt, long texts cut to ``width`` characters."""
    def cut(text: str) -> str:
        text = text.replace("\n", "\\n")
        return text if len(text) <= width else text[:width - 1] + "…"

    lines = []
    for i, row in enumerate(rows, 1):
        prompt = row["prompt"].replace("\n", "\\n")
        prompt = prompt if len(prompt) <= width else "…" + prompt[-(width - 1):]  # its end leads to the answer
        lines += [f"sample {i}: prompt    {prompt}", f"          reference {cut(row['reference'])}",
                  f"          base      {cut(row['base'])}", f"          adapter   {cut(row['adapter'])}"]
    return "\n".join(lines)


def _write_new(path: Path, text: str, replace: bool = True) -> None:
    """Write ``path`` whole (core/files.py). With ``replace`` false an existing ``path`` is kept (two
    evaluations at once cannot both write it) and the second writer gets a TaskEvalError."""
    what = f"the task eval's {path.name}"
    fix = f"free space, then evaluate with `packtrain eval <expert> --run {path.parent}`"
    if replace:
        write_atomic(path, text, what, fix)
        return
    try:
        write_new(path, text, what, fix)
    except FileExistsError:
        check_not_evaluated(path.parent)
        raise


def sample_max_new_tokens(configured: int | str, max_new_tokens: int, longest_reference: int, device_type: str) -> int:
    """New tokens for the end-of-run samples (to read, not to score): ``train.sample_max_new_tokens``;
    ``auto``: twice the longest reference plus 8, at most ``max_new_tokens``, and at most
    CPU_SAMPLE_MAX_NEW_TOKENS on a CPU::

        >>> [sample_max_new_tokens("auto", 128, 60, d) for d in ("cpu", "cuda")], sample_max_new_tokens(64, 128, 60, "cpu")
        ([32, 128], 64)
        >>> sample_max_new_tokens("auto", 128, 5, "cpu")
        18
    """
    if configured != "auto":
        return int(configured)
    bound = min(max_new_tokens, 2 * longest_reference + 8)
    return bound if device_type == "cuda" else min(bound, CPU_SAMPLE_MAX_NEW_TOKENS)


def end_of_run(ctx: TrainContext) -> dict | None:
    """What every run ends with: the base model's and the adapter's answers to
    ``train.sample_prompts`` validation prompts in the log, then (``train.task_eval``; auto: on
    CUDA) the task evaluation of ``train.task_eval_max_examples`` prompts; returns its summary."""
    train, expert, manifest, device, run_dir = ctx.train, ctx.config.expert, ctx.manifest, ctx.device, ctx.run.run_dir
    enabled = train.task_eval if isinstance(train.task_eval, bool) else device.type == "cuda"
    limit = max(train.sample_prompts, example_limit(train.task_eval_max_examples, device) if enabled else 0)
    if limit == 0:
        return None
    examples = val_examples(ctx.build_dir, manifest, limit)
    if not examples:
        log.info("no validation prompts in build %s (val documents with a prompt before the answer): no sample "
                 "answers, no task eval", manifest.build_id)
        return None
    answers = Answers(ctx.model, ctx.tok_dir, manifest, device, ctx.precision, train.max_new_tokens,
                      train.per_device_eval_batch_size)
    if train.sample_prompts:
        shown = examples[:train.sample_prompts]
        bound = sample_max_new_tokens(train.sample_max_new_tokens, train.max_new_tokens,
                                      max(len(e.reference_ids) for e in shown), device.type)
        log.info("samples: base model vs adapter on %d validation prompts, greedy, each stopping at the eos or after "
                 "%d new tokens (train.sample_max_new_tokens: %s)", len(shown), bound,
                 "auto, at most %d on a CPU" % CPU_SAMPLE_MAX_NEW_TOKENS
                 if train.sample_max_new_tokens == "auto" and device.type != "cuda" else train.sample_max_new_tokens)
        rows = answers.side_by_side(shown, bound, what="samples")
        log.info("base model vs adapter on %d validation prompts:\n%s", len(rows), format_samples(rows))
    if not enabled:
        log.info("task eval: off (%s); run `packtrain eval %s --run %s` for it",
                 "train.task_eval: false" if train.task_eval is False else "auto: off on CPU", expert, run_dir)
        return None
    if (run_dir / EVAL_SUMMARY).exists():  # the run was stopped after its task eval, then resumed
        log.info("task eval: %s exists (written before this run was interrupted); kept", run_dir / EVAL_SUMMARY)
        return json.loads((run_dir / EVAL_SUMMARY).read_text())
    summary = task_eval(answers, examples, expert, train.task_metric, run_dir)
    log.info("%s (%s)", format_summary(summary), run_dir / EVAL_SUMMARY)
    return summary
