"""The run-start check that packed documents do not see each other, on the real model and attention path.

packtrain's packed forward (trainer/model/model.py ``packed_forward``) relies on the model: the reference
attention needs transformers to find the documents in the position ids (``create_causal_mask``), the varlen
path needs every layer to go through the attention function. Architectures that do neither exactly leak one
document into the next and train silently wrong: recurrent or convolutional layers whose state runs on across
documents (Mamba hybrids: Bamba, Falcon-H1, Jamba, Zamba2, LFM2, Qwen3-Next, ...), models whose mask or positions
come from elsewhere than the position ids where no ready-made mask helps (BLOOM's ALiBi, RoBERTa's numbering; the
ones a mask helps get it: trainer/model/model.py ``packed_mask``).

So before the first step (trainer/run/context.py ``setup_model``) a probe runs through the model exactly as
training will, in eval mode without gradients, under the run's precision: two blocks of two documents and a
padding tail, ``[A B .]`` and ``[A' B .]``, one forward, then ``A`` and ``B`` each alone (``model(input_ids)``,
no position ids, as a user runs a document). Isolation means B's logits do not depend on A (the check that
catches a leak whatever its mechanism), and each document's logits equal its logits alone (the check that
catches positions that do not restart, or that the model numbers otherwise: RoBERTa's start at padding_idx + 1).
A model that fails is refused in one line naming its type. The cost is three forwards of at most 36 tokens
(docs/BENCHMARKS.md: 3% of one 2048-token block's forward).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from packtrain.core.blocks import position_ids_from_doc_lens, segment_lens
from packtrain.trainer.model.attention import AttentionChoice, attention_inputs
from packtrain.trainer.model.model import Precision, packed_forward
from packtrain.trainer.run.run_checks import TrainError

PROBE_LENS = (9, 6)
"""The probe's documents; a block of :data:`PROBE_BLOCK` ends with their padding tail."""
PROBE_BLOCK = 18

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-2}
"""The largest difference the check accepts, relative to the largest logit (at least 1): fp32 reorders sums
(about 1e-7), half-precision compute rounds (about 1e-2); a leak moves logits by their own size."""


class IsolationError(TrainError):
    """The model lets packed documents see each other; the message names its type and what to do."""


@dataclass(frozen=True)
class Isolation:
    leak: float       # the most B's logits move when A changes, relative to the largest logit
    mismatch: float   # the most a document's packed logits differ from its logits alone, likewise
    tolerance: float

    @property
    def exact(self) -> bool:
        return self.leak <= self.tolerance and self.mismatch <= self.tolerance


def _segments(lens: list[int]) -> dict[str, torch.Tensor]:
    """What ``attention_inputs`` reads from a collated batch, for blocks of the segments ``lens``."""
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return {"cu_seq_lens": cu, "max_length": torch.tensor(max(lens))}


def probe(model: torch.nn.Module, device: torch.device, choice: AttentionChoice | None,
          precision: Precision | None = None) -> Isolation:
    """Run the probe through ``model`` (the causal LM, its attention path already set) on ``device``."""
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    # ordinary tokens: special ones (a multimodal model's image tokens) sit at the ends of a vocabulary
    a, a2, b = (torch.randint(vocab // 8, vocab // 2, (n,), generator=g)
                for n in (PROBE_LENS[0], PROBE_LENS[0], PROBE_LENS[1]))
    pad = torch.full((PROBE_BLOCK - sum(PROBE_LENS),), int(b[0]))
    ids = torch.stack([torch.cat([a, b, pad]), torch.cat([a2, b, pad])]).to(device)
    positions = torch.from_numpy(position_ids_from_doc_lens(PROBE_LENS, PROBE_BLOCK)).expand(2, -1).to(device)
    segments = segment_lens(PROBE_LENS, PROBE_BLOCK)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), (precision.autocast(device) if precision else contextlib.nullcontext()):
            packed = packed_forward(model, ids, positions, **attention_inputs(_segments(segments * 2), device, choice))
            # alone as a user runs a document: no position ids (a model that numbers its positions its own way,
            # RoBERTa's from padding_idx + 1, differs from packtrain's restarting ones)
            alone = [model(input_ids=doc[None].to(device), use_cache=False,
                           **attention_inputs(_segments([len(doc)]), device, choice)).logits for doc in (a, b)]
    finally:
        model.train(was_training)
    packed, alone = packed.float(), [x[0].float() for x in alone]
    scale = max(1.0, max(x.abs().max().item() for x in alone))
    n = PROBE_LENS[0]
    leak = (packed[0, n:n + len(b)] - packed[1, n:n + len(b)]).abs().max().item() / scale
    mismatch = max((packed[0, :n] - alone[0]).abs().max().item(),
                   (packed[0, n:n + len(b)] - alone[1]).abs().max().item()) / scale
    dtype = precision.autocast_dtype if precision and precision.autocast_dtype else next(model.parameters()).dtype
    return Isolation(leak, mismatch, TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16]))


def check_document_isolation(model: torch.nn.Module, model_name: str, device: torch.device,
                             choice: AttentionChoice | None, precision: Precision | None = None) -> Isolation:
    """Refuse, before the first step, a model whose packed forward lets documents see each other
    (:func:`probe`); returns the probe's result for the log."""
    kind = f"model {model_name} (model type {getattr(model.config, 'model_type', '?')!r}, {type(model).__name__})"
    path = f"{choice.name if choice else 'the reference'} attention"
    varlen = choice is not None and choice.varlen  # the reference attention may still be exact
    fix = ("; set model.varlen_attention: false (the reference attention), or use" if varlen else "; use") + \
        " a model type listed as exact in docs/TRAINING.md ('Which architectures')"
    try:
        result = probe(model, device, choice, precision)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # whatever the architecture raises on packed input: one line, not a traceback
        said = str(e).splitlines()[0] if str(e) else ""
        raise IsolationError(f"{kind} fails on packed blocks with {path} ({type(e).__name__}: {said}){fix}") from None
    wrong = "so training on packed blocks would be silently wrong"
    if result.leak > result.tolerance:
        raise IsolationError(f"{kind} lets packed documents see each other with {path} (a document's logits move by "
                             f"{result.leak:.2g} of the largest logit when the document before it changes; tolerance "
                             f"{result.tolerance:g}): its attention or recurrent state is not isolated by position ids, "
                             f"{wrong}{fix}")
    if result.mismatch > result.tolerance:
        raise IsolationError(f"{kind} gives packed documents other logits than alone with {path} (by "
                             f"{result.mismatch:.2g} of the largest logit; tolerance {result.tolerance:g}): it does not number "
                             f"a packed document's positions as it numbers a document alone, {wrong}{fix}")
    return result
