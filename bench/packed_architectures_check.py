"""Every causal LM architecture the installed transformers ships, through packtrain's packed path: exact, or refused.

The sweep behind docs/TRAINING.md's 'Which architectures' table (tests/test_packed_architectures.py pins the
architectures users fine-tune; run this after upgrading transformers). For each ``*ForCausalLM`` model type
(encoder-decoders and multimodal configs left out), a tiny random model as the test builds it (its generic sizes;
the test's own fields where it names the type): a packed block of three documents and a padding tail through
``packed_forward`` against each document alone through ``model(input_ids)``, the run-start probe's verdict
(trainer/run/isolation.py), and, where ``choose_attention`` would pick varlen on a GPU, the varlen path with the
stand-in kernel. A type whose tiny config transformers rejects is listed as a harness error, not a result.

    .venv/bin/python -P bench/packed_architectures_check.py [MODEL_TYPE ...]
"""

import signal
import sys
import warnings
from pathlib import Path

import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_attention import per_segment_kernel  # noqa: E402
from test_packed_architectures import BLOCK, EXACT, LENS, REFUSED, documents, packed_error, tiny_model, varlen_choice  # noqa: E402

from packtrain.core.blocks import segment_lens  # noqa: E402
from packtrain.trainer.data.data import collate  # noqa: E402
from packtrain.trainer.model import attention  # noqa: E402
from packtrain.trainer.run.isolation import IsolationError, check_document_isolation  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def verdict(model_type: str) -> str:
    config = CONFIG_MAPPING[model_type]()
    if getattr(config, "is_encoder_decoder", False) or [k for k in getattr(config, "sub_configs", {}) if k != "text_config"]:
        return "left out (encoder-decoder or multimodal config)"
    model = tiny_model(model_type, {**EXACT, **REFUSED}.get(model_type, {}))
    docs, ids, positions = documents()
    with torch.no_grad():
        alone = [model(input_ids=d[None]).logits[0] for d in docs]
    words = [f"packed vs alone {packed_error(model, docs, ids, positions, alone):.1e}"]
    try:
        check_document_isolation(model, model_type, torch.device("cpu"), None)
        words.append("probe: exact")
    except IsolationError as e:
        words.append("probe: REFUSED (" + ("leak" if "see each other" in str(e) else "positions" if "other logits"
                                           in str(e) else "error") + ")")
    choice = varlen_choice(model)
    if choice.varlen:
        attention.register(per_segment_kernel)
        model.set_attn_implementation(attention.VARLEN_NAME)
        batch = collate([{"input_ids": ids[0], "position_ids": positions[0], "n_sup": torch.tensor(0),
                          "seq_lens": torch.tensor(segment_lens(LENS, BLOCK), dtype=torch.int32)}])
        try:
            inputs = attention.attention_inputs(batch, torch.device("cpu"), choice)
            words.append(f"varlen {packed_error(model, docs, ids, positions, alone, **inputs):.1e}")
        except RuntimeError as e:
            words.append(f"varlen fails ({str(e)[:60]})")
    else:
        words.append("GPU: reference")
    return "; ".join(words)


def main() -> None:
    def too_long(*_):
        raise TimeoutError("over 60 s")
    signal.signal(signal.SIGALRM, too_long)
    print("| model type | class | result |\n|---|---|---|")
    for model_type in sys.argv[1:] or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        signal.alarm(60)
        try:
            result = verdict(model_type)
        except Exception as e:  # a tiny config transformers rejects: the harness's, not packtrain's
            result = f"harness error: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        signal.alarm(0)
        print(f"| {model_type} | {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]} | {result} |", flush=True)


if __name__ == "__main__":
    main()
