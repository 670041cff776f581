"""The tokenizers and chat templates bench/chat_reference_check.py checks (its :class:`Setup` list): the real
tokenizers' own templates (tests/real_tokenizers.py) and synthetic ones on Qwen3's tokenizer, each with a copy
written with ``{% generation %}`` markers, whose ``return_assistant_tokens_mask`` is the mask reference."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from real_tokenizers import MARKED_SMOLLM2  # noqa: E402


def trl_template(name: str) -> str | None:
    """TRL's stored chat template ``name`` (trl/chat_templates/), None where TRL is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    path = None if spec is None else Path(spec.origin).parent / "chat_templates" / f"{name}.jinja"
    return path.read_text() if path is not None and path.is_file() else None


@dataclass
class Setup:
    """A tokenizer and a chat template to check (``marked``: the same template with generation markers
    around each assistant turn, from where its generation prompt ends through its end-of-turn token)."""

    name: str
    directory: Path
    template: str
    marked: str | None
    eos: str
    bos: str | None = None
    kwargs: dict = field(default_factory=dict)
    tools: bool = False  # the rows' tool definitions go to the template (format.tools)
    system: str | None = None  # format.system
    each_turn: bool = False  # format.each_assistant_turn
    prompt_side: tuple[str, ...] = ()
    """Text the reference mask supervises and the build, by its documented choice, does not, or the
    reverse (docs/BUILD.md, Conversations): a mask that differs only on these tokens is ``m``, not ``!``."""


QWEN2_INSTRUCT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MARKED_QWEN2 = MARKED_SMOLLM2.replace("You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                                      "You are a helpful assistant.")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>'"
          " + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
          "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MARKED_LLAMA3 = ("{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
                 "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
                 "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
                 "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
MARKED_GEMMA = GEMMA.replace(
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}",
    "{{ '<start_of_turn>' + role + '\n' }}{% if role == 'model' %}{% generation %}{{ message['content'] | trim + "
    "'<end_of_turn>' }}{% endgeneration %}{% else %}{{ message['content'] | trim + '<end_of_turn>' }}{% endif %}"
    "{{ '\n' }}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
MARKED_MISTRAL = MISTRAL.replace("{{ message['content'] + eos_token}}",
                                 "{% generation %}{{ message['content'] + eos_token}}{% endgeneration %}")
# a template written with generation markers of its own (the build renders their bodies)
TAGGED = MARKED_SMOLLM2.replace("You are a helpful AI assistant named SmolLM, trained by Hugging Face", "Be kind.")


def qwen3_marked(template: str) -> str:
    """Qwen3's own template with generation markers around each assistant turn after its header: the
    same text (checked by :func:`compare`), the turn's reasoning block included where the template writes one."""
    branch = "        {%- if loop.index0 > ns.last_query_index %}"
    end = "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}"
    assert branch in template and end in template
    out = template.replace("'<|im_start|>' + message.role + '\\n<think>", "'<think>").replace(
        "'<|im_start|>' + message.role + '\\n' + content", "content")
    out = out.replace(branch, "        {{- '<|im_start|>' + message.role + '\\n' }}{%- generation %}\n" + branch)
    return out.replace(end, "        {{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n    {%- elif message.role == \"tool\" %}")


SYNTHETIC_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<bos>",
                      "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>",
                      "<|end|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
SYNTHETIC_ADDED = ("<｜User｜>", "<｜Assistant｜>")  # DeepSeek's turn markers: added tokens, not special ones


def with_specials(source: Path, directory: Path) -> Path:
    """A copy of ``source`` (a tokenizer directory) whose tokenizer.json has the synthetic templates' special tokens."""
    from tokenizers import AddedToken, Tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SYNTHETIC_SPECIALS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in SYNTHETIC_ADDED])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)  # tokenizer.json lists every added token, these too
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def setups(made: dict[str, Path], root: Path) -> list[Setup]:
    """Every setup checked, over the real tokenizers ``made`` (smollm2, qwen3, qwen2: tests/real_tokenizers.py),
    the synthetic templates' tokenizer written under ``root``."""
    qwen3_template = json.loads((made["qwen3"] / "tokenizer_config.json").read_text())["chat_template"]
    qwen3_marked_template = qwen3_marked(qwen3_template)
    synthetic = with_specials(made["qwen3"], root / "synthetic")
    return [
        Setup("smollm2", made["smollm2"], (made["smollm2"] / "chat_template.jinja").read_text(), MARKED_SMOLLM2,
              "<|im_end|>"),
        Setup("qwen3", made["qwen3"], qwen3_template, qwen3_marked_template, "<|im_end|>"),
        Setup("qwen3 thinking off", made["qwen3"], qwen3_template, qwen3_marked_template, "<|im_end|>",
              kwargs={"enable_thinking": False},
              # the generation prompt holds the empty reasoning block: the build supervises what follows it; a
              # turn with reasoning does not start with it, so its header is supervised (chat_render.turn_head)
              prompt_side=("<think>", "\n\n", "</think>", "<|im_start|>", "assistant", "\n")),
        Setup("qwen3 each turn", made["qwen3"], qwen3_template, qwen3_marked_template, "<|im_end|>", each_turn=True),
        Setup("qwen3 + tools", made["qwen3"], qwen3_template, qwen3_marked_template, "<|im_end|>", tools=True),
        Setup("qwen2", made["qwen2"], QWEN2_INSTRUCT, MARKED_QWEN2, "<|im_end|>"),
        # Qwen2.5's template (Qwen's tool format, earlier turns kept) on Qwen3's tokenizer: the mask reference is
        # TRL's training template, which also supervises the newline after "assistant" and after <|im_end|>
        Setup("qwen2.5 + tools", made["qwen3"], (ROOT / "tests/chat_templates/qwen2_5.jinja").read_text(),
              trl_template("qwen2_5_training"), "<|im_end|>", tools=True, prompt_side=("\n",)),
        Setup("qwen2 + format.system", made["qwen2"], QWEN2_INSTRUCT, MARKED_QWEN2, "<|im_end|>", system="Be terse."),
        Setup("smollm2 each turn", made["smollm2"], (made["smollm2"] / "chat_template.jinja").read_text(),
              MARKED_SMOLLM2, "<|im_end|>", each_turn=True),
        Setup("llama3-style", synthetic, LLAMA3, MARKED_LLAMA3, "<|eot_id|>", bos="<|begin_of_text|>"),
        Setup("gemma-style", synthetic, GEMMA, MARKED_GEMMA, "<end_of_turn>", bos="<bos>"),
        Setup("mistral [INST]", synthetic, MISTRAL, MARKED_MISTRAL, "</s>", bos="<s>"),
        Setup("generation-tagged", made["smollm2"], TAGGED, TAGGED, "<|im_end|>"),
        # the models' own templates as TRL stores them, TRL's training templates the mask reference; Phi-3 ends the
        # conversation with the EOS (supervised with the last turn), DeepSeek-V3's generation prompt adds <think>
        Setup("phi3", synthetic, (ROOT / "tests/chat_templates/phi3.jinja").read_text(), trl_template("phi3_training"),
              "<|endoftext|>", prompt_side=("\n",)),
        Setup("deepseekv3", synthetic, (ROOT / "tests/chat_templates/deepseekv3.jinja").read_text(),
              trl_template("deepseekv3_training"), "<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>"),
    ]
