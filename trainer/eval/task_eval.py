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
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from packtrain.core.errors import PacktrainError
from packtrain.core.config_train import CPU_GENERATION_BATCH, CPU_SAMPLE_MAX_NEW_TOKENS
from packtrain.core.contract import Manifest
from packtrain.core.files import write_atomic, write_new
from packtrain.core.shardfile import open_shard
from packtrain.trainer.eval.base_samples import (base_identity, keep_base_answers, load_base_answers, samples_key,
                                                 samples_path)
from packtrain.trainer.eval.budget import Example, fit_samples, fit_task
from packtrain.trainer.eval.generate import Greedy, generate
from packtrain.trainer.model.model import Precision
from packtrain.trainer.eval.task_metrics import aggregate, metric_for, score

if TYPE_CHECKING:  # the training run's context; `packtrain eval` does without it (eval_run.py)
    from packtrain.trainer.run.context import TrainContext

log = logging.getLogger("packtrain.train")

EVAL_SUMMARY, EVAL_SAMPLES = "eval.json", "eval.jsonl"


class TaskEvalError(PacktrainError):
    """Task evaluation cannot run; the message says why and what to do."""


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


def val_examples(build_dir: Path, manifest: Manifest, limit: int, blocks: range | None = None) -> list[Example]:
    """The first ``limit`` examples of the build's val split, in shard order; ``blocks``: of those val
    blocks only (an eval source's, ``Manifest.eval_sets``)."""
    eos_id = manifest.eos_id
    examples: list[Example] = []
    block = 0
    for shard in manifest.val:
        blocks_here = open_shard(build_dir / shard.file, manifest.block_size)
        for row in range(len(blocks_here)):
            block += 1
            if blocks is not None and block - 1 not in blocks:
                continue
            ids, mask, doc_lens = blocks_here.block(row)
            at = 0
            for n in doc_lens.tolist():
                example = split_document(ids[at:at + n], mask[at:at + n], eos_id)
                at += n
                if example is not None:
                    examples.append(example)
                    if len(examples) == limit:
                        return examples
    return examples


def eval_parts(build_dir: Path, manifest: Manifest, limit: int) -> dict[str | None, list[Example]]:
    """The first ``limit`` examples of each eval source (by name), or of the val split (None) for a
    build without eval sources."""
    if not manifest.eval_sets:
        return {None: val_examples(build_dir, manifest, limit)}
    return {e.name: val_examples(build_dir, manifest, limit, range(e.first_block, e.stop)) for e in manifest.eval_sets}


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
        # a decode step is one forward of the batch: on a CPU at least CPU_GENERATION_BATCH prompts a batch
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size if device.type == "cuda" else max(batch_size, CPU_GENERATION_BATCH)

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
                     what: str = "task eval", base: list[str] | None = None) -> list[dict]:
        """One row per example: prompt, reference, base answer, adapter answer (texts). The prompt keeps
        its special tokens (a chat template's ``<|im_start|>user``...), as ``packtrain inspect`` shows
        the text: what the model was prompted with; the answers and the reference are the texts scored.
        ``base``: the base model's answers, already known (trainer/eval/base_samples.py), not generated."""
        if base is None:
            base = self.answer(examples, adapter=False, max_new_tokens=max_new_tokens, what=what)
        tuned = self.answer(examples, adapter=True, max_new_tokens=max_new_tokens, what=what)
        return [{"prompt": self.tokenizer.decode(e.prompt_ids, skip_special_tokens=False), "reference": self.decode(e.reference_ids), "base": b,
                 "adapter": a} for e, b, a in zip(examples, base, tuned)]


def task_eval(answers: Answers, parts: dict[str | None, list[Example]], expert: str, metric_setting: str,
              run_dir: Path) -> dict:
    """Score base and adapter on the examples of ``parts`` (each eval source's by name, or the val split's
    under None: :func:`eval_parts`); write ``eval.jsonl`` and ``eval.json`` into ``run_dir``
    (refused when the run has an ``eval.json``: an evaluation is never overwritten); returns the summary:
    the means over every example, and each eval source's under ``eval_sets``.

    ``eval.json`` is written last and is the evaluation's mark of completion: an ``eval.jsonl`` without
    it is what an interrupted evaluation left, and is replaced."""
    check_not_evaluated(run_dir)
    if not any(parts.values()):
        raise TaskEvalError(f"the build has no validation prompts (val documents with a prompt before the "
                            f"answer): rebuild {expert} with pack.val_fraction > 0 or an eval source "
                            "(sources[].role: eval)")
    metric = metric_for(expert, metric_setting)
    rows, sets = [], {}
    for name, examples in parts.items():
        mine = answers.side_by_side(examples, what="task eval" + (f", {name}" if name else ""))
        for row in mine:
            row["base_scores"] = score(metric, row["base"], row["reference"])
            row["adapter_scores"] = score(metric, row["adapter"], row["reference"])
            if name is not None:
                row["eval_set"] = name
        if name is not None and mine:
            sets[name] = {"examples": len(mine), "base": aggregate([r["base_scores"] for r in mine]),
                          "adapter": aggregate([r["adapter_scores"] for r in mine])}
        rows += mine
    summary = {
        "expert": expert, "metric": metric, "examples": len(rows), "max_new_tokens": answers.max_new_tokens,
        "base": aggregate([r["base_scores"] for r in rows]),
        "adapter": aggregate([r["adapter_scores"] for r in rows]),
        **({"eval_sets": sets} if sets else {}),
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
    """``task eval (sql, 16 examples): exact_match base 0.00 -> adapter 0.50; parses ...``, then a line per
    eval source where the build has them (``task eval, dev.jsonl (sql, 16 examples): ...``)."""
    def line(what: str, part: dict) -> str:
        return f"{what} ({summary['metric']}, {part['examples']} examples): " + "; ".join(
            f"{key} base {part['base'][key]:.2f} -> adapter {part['adapter'][key]:.2f}" for key in part["adapter"])

    sets = summary.get("eval_sets", {})
    if len(sets) == 1:
        return line(f"task eval, {next(iter(sets))}", summary)
    return "\n".join([line("task eval", summary)] + [line(f"task eval, {name}", part) for name, part in sets.items()])


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
    ``train.sample_prompts`` validation prompts in the log (of the first eval source where the build
    has them), then (``train.task_eval``; auto: on CUDA) the task evaluation of
    ``train.task_eval_max_examples`` prompts (of each eval source); returns its summary. On a CPU
    (the cpu profile) both read at most ``cpu.generate_tokens`` tokens a model (trainer/eval/budget.py)."""
    train, expert, manifest, device, run_dir = ctx.train, ctx.config.expert, ctx.manifest, ctx.device, ctx.run.run_dir
    enabled = train.task_eval if isinstance(train.task_eval, bool) else device.type == "cuda"
    limit = max(train.sample_prompts, example_limit(train.task_eval_max_examples, device) if enabled else 0)
    if limit == 0:
        return None
    parts = eval_parts(ctx.build_dir, manifest, limit)
    if not any(parts.values()):
        log.info("no validation prompts in build %s (val documents with a prompt before the answer): no sample "
                 "answers, no task eval", manifest.build_id)
        return None
    budget = ctx.config.cpu.generate_tokens if device.type != "cuda" and ctx.config.cpu.enabled else None
    answers = Answers(ctx.model, ctx.tok_dir, manifest, device, ctx.precision, train.max_new_tokens,
                      train.per_device_eval_batch_size)
    if train.sample_prompts:
        name, examples = next((name, examples) for name, examples in parts.items() if examples)
        show_samples(answers, examples[:train.sample_prompts], train, device.type, budget, name, ctx.build_dir,
                     base_identity(ctx))
    if not enabled:
        log.info("task eval: off (%s); run `packtrain eval %s --run %s` for it",
                 "train.task_eval: false" if train.task_eval is False else "auto: off on CPU", expert, run_dir)
        return None
    if (run_dir / EVAL_SUMMARY).exists():  # the run was stopped after its task eval, then resumed
        log.info("task eval: %s exists (written before this run was interrupted); kept", run_dir / EVAL_SUMMARY)
        return json.loads((run_dir / EVAL_SUMMARY).read_text())
    if budget is not None:
        parts = {name: fit_for_task(name, examples, budget, train.max_new_tokens) for name, examples in parts.items()}
        if not any(parts.values()):
            log.info("task eval: skipped, no prompt fits; run `packtrain eval %s --run %s` for it", expert, run_dir)
            return None
    summary = task_eval(answers, parts, expert, train.task_metric, run_dir)
    log.info("%s (%s)", format_summary(summary), run_dir / EVAL_SUMMARY)
    return summary


def fit_for_task(name: str | None, examples: list[Example], budget: int, new_tokens: int) -> list[Example]:
    """:func:`fit_task`'s examples, the line it makes said."""
    kept, said = fit_task(examples, budget, new_tokens)
    if said:
        log.info("task eval%s: %s; `packtrain eval` scores them all (cpu.generate_tokens does not bound it)",
                 f", {name}" if name else "", said)
    return kept


def show_samples(answers: Answers, shown: list[Example], train, device_type: str, budget: int | None,
                 name: str | None, build_dir: Path, identity: dict | None = None) -> None:
    """Log the base model's and the adapter's answers to ``shown`` (of the eval source ``name``), their
    prompts cut to fit ``budget`` tokens a model where it is set (a CPU), as the log says. With
    ``identity`` (trainer/eval/base_samples.py) the base model's answers are kept in ``build_dir`` and
    reused by the next run with the same base model, prompts and settings."""
    bound = sample_max_new_tokens(train.sample_max_new_tokens, train.max_new_tokens,
                                  max(len(e.reference_ids) for e in shown), device_type)
    of = f"validation prompts of {name}" if name else "validation prompts"
    log.info("samples: base model vs adapter on %d %s, greedy, each stopping at the eos or after "
             "%d new tokens (train.sample_max_new_tokens: %s)", len(shown), of, bound,
             "auto, at most %d on a CPU" % CPU_SAMPLE_MAX_NEW_TOKENS
             if train.sample_max_new_tokens == "auto" and device_type != "cuda" else train.sample_max_new_tokens)
    if budget is not None:
        shown, said = fit_samples(shown, budget, bound)
        if said:
            log.info("samples: %s; the start of a cut prompt is left out (cpu.enabled: false, or a GPU, shows them "
                     "whole)", said)
    key = samples_key(identity, [e.prompt_ids for e in shown], bound, answers.batch_size) if identity else None
    base = load_base_answers(build_dir, key, len(shown)) if key else None
    if base is not None:
        log.info("samples, base model: %d answers reused from %s (the same base model, prompts and settings "
                 "as an earlier run of this build)", len(base), samples_path(build_dir, key))
    rows = answers.side_by_side(shown, bound, what="samples", base=base)
    if key and base is None:
        keep_base_answers(build_dir, key, [row["base"] for row in rows])
    log.info("base model vs adapter on %d %s:\n%s", len(rows), of, format_samples(rows))
