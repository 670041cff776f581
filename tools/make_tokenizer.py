"""Train the bundled demo tokenizer on the bundled samples.

    python tools/make_tokenizer.py               # rewrite packtrain/core/assets/demo-model/tokenizer*.json
    python tools/make_tokenizer.py --out /tmp/t  # write elsewhere

A byte-level BPE like Qwen2's, only much smaller: Qwen2's pre-tokenizer regex (split off letters,
single digits, punctuation runs, newlines and spaces) followed by ByteLevel, a ByteLevel decoder,
no normalizer (so decode(encode(x)) == x for any text), and 8192 tokens in all:

    id 0 <|endoftext|>   eos, and the document separator
    id 1 <|im_start|>    ChatML turn start
    id 2 <|im_end|>      ChatML turn end
    id 3 <|pad|>         padding
    id 4..259            the 256 byte symbols
    id 260..8191         merges learned from the four sample files

It is trained on ``pipeline/assets/samples/*.jsonl.gz`` (every field of every row, as the formatter
would see it), so run ``tools/make_samples.py`` first when the samples change.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "pipeline" / "assets" / "samples"
DEFAULT_OUT = ROOT / "packtrain" / "core" / "assets" / "demo-model"

VOCAB_SIZE = 8192
EOS, IM_START, IM_END, PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END, PAD]  # ids 0, 1, 2, 3 in this order
MODEL_MAX_LENGTH = 4096

# Qwen2's pre-tokenizer split (tokenizer.json of Qwen/Qwen2-0.5B).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML, as Qwen2's template without tools and without an implicit default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def sample_texts(samples_dir: Path = SAMPLES):
    """Every field of every sample row, one string at a time, in file order."""
    files = sorted(samples_dir.glob("*.jsonl.gz"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl.gz in {samples_dir}; run tools/make_samples.py first")
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                for key in sorted(row):
                    yield row[key]


def build_tokenizer(samples_dir: Path = SAMPLES) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sample_texts(samples_dir), trainer=trainer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab_size != VOCAB_SIZE:
        raise RuntimeError(f"trained {vocab_size} tokens, expected {VOCAB_SIZE}: the samples are too small for that many merges")
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == expected_id, (token, tokenizer.token_to_id(token))
    return tokenizer


def tokenizer_config() -> dict:
    """tokenizer_config.json as transformers' PreTrainedTokenizerFast reads it."""
    added = {
        str(i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for i, token in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def write_tokenizer(out_dir: str | Path = DEFAULT_OUT, samples_dir: Path = SAMPLES) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(samples_dir)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    with open(out_dir / "tokenizer_config.json", "w", encoding="utf-8", newline="\n") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    parser.add_argument("--samples", default=str(SAMPLES), help="directory of *.jsonl.gz samples (default: %(default)s)")
    args = parser.parse_args(argv)
    out = write_tokenizer(args.out, Path(args.samples))
    print(f"wrote {out / 'tokenizer.json'} and {out / 'tokenizer_config.json'} ({VOCAB_SIZE} tokens)")


if __name__ == "__main__":
    main()
