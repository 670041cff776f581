"""Conversations built end to end the TRL way and packtrain's way give the same blocks.

The TRL way: ``apply_chat_template(messages, tokenize=True, return_dict=True,
return_assistant_tokens_mask=True)`` on a template with ``{% generation %}`` markers, then
``trl.pack_dataset(ds, block_size, strategy="bfd")`` in one map batch. packtrain packs a split whole
and breaks bfd ties as TRL does, so its blocks hold the same documents in the same order, token for
token and mask for mask (``loss_mask`` is ``assistant_masks``, ``doc_lens`` is ``seq_lengths``), once
the documented differences (docs/BUILD.md, Conversations) are applied to the reference:

- the newline the template writes after the last ``<|im_end|>`` is not in packtrain's document (it
  ends at the EOS, ``<|im_end|>`` for Qwen3's tokenizer; the newline is never trained on);
- the conversations hold special-token strings, which TRL encodes as the special tokens: the build is
  made with ``build.special_tokens_in_text: special`` (the default, ``text``, encodes them as text);
- a row whose assistant turn starts inside a token (a turn opening with a newline joins the
  template's ``assistant\\n``) is a bad row, where TRL trains the joined token;
- a conversation longer than a block: ``pack.overlong: truncate`` keeps its first block of tokens, as
  ``strategy="bfd"`` truncates; ``split`` (the default) cuts it into pieces, as ``"bfd_split"`` does,
  and the first token of every piece is never a target (nothing before it in the block is of its
  document), where TRL's fragment keeps its mask.

Qwen3's real tokenizer with SmolLM2's template written with markers (its default system prompt
included), blocks of 256 tokens so several conversations share a block, rows read in batches of 5
(the build packs them together, as TRL packs one map batch).
"""

from __future__ import annotations

import json

import pytest
from build_fixtures import chat_configs, seed_decision
from real_tokenizers import MARKED_SMOLLM2
from test_chat_templates import A, S, U

from packtrain.core.configfile import load_config
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.orchestrate.build import build

BLOCK = 256




QA = [("How many singers do we have?", "SELECT count(*) FROM singer"),
      ("Show the name and country of every singer older than 30.", "SELECT name, country FROM singer WHERE age > 30"),
      ("Which 3 users posted most?", "MATCH (u:User)-[:POSTED]->(p)\nRETURN u, count(p) AS n\nORDER BY n DESC\nLIMIT 3"),
      ("What is the average age of all singers from France?", "SELECT avg(age) FROM singer WHERE country = 'France'"),
      ("List the stadiums with a capacity above 5000.", "SELECT name FROM stadium WHERE capacity > 5000")]


def conversations() -> list[list[dict]]:
    """Every shape the tests of single documents cover, several times over, so blocks mix them."""
    out = []
    for i, (q, a) in enumerate(QA * 6):
        q2, a2 = QA[(i + 1) % len(QA)]
        out.append([
            [U(q), A(a)],
            [S("You write SQL."), U(q), A(a), U(q2), A(a2)],
            [S(""), U(""), A(a)],
            [U(f"héllo 日本語 🙂\u200b {q}"), A(f"{a} -- réponse ✓")],
            [U(q + " <|im_end|>"), A(a + " <|im_start|>user\nx<|endoftext|>")],
            [U(q), A(a), U(q2)],
            [U(q), A(a), A(a2)],
            [U(q), A(a), S("Answer briefly now."), U(q2), A(a2)],
            [S("You write SQL."), A("Hello, what do you need?"), U(q), A(a)],
            [U("  " + q + " \n"), A(a + "\n\n")],
        ][i % 10])
    out[7] = [S("Long history.")] + [m for q, a in QA * 3 for m in (U(q), A(a))]  # longer than a block
    out[13] = [U("Rows?"), A("\nSELECT 1")]  # opens with a newline: a bad row (TRL trains it)
    out.append(out[0])  # a duplicate: packed twice (dedup: none), as TRL packs it
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(real_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("marked") / "tokenizer"
    directory.mkdir()
    source = real_tokenizer("qwen3")
    (directory / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    config = json.loads((source / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": MARKED_SMOLLM2}))
    return directory


def packtrain_blocks(tmp_path, tokenizer_dir, chats: list, overlong: str) -> tuple[list[tuple[list, list, list]], dict]:
    configs = chat_configs(tmp_path, [{"messages": c} for c in chats], tokenizer_dir, BLOCK)
    seed_decision(tmp_path / "cache", tokenizer_dir)
    # TRL encodes the template's special-token strings the conversations hold as the special tokens (the
    # tokenizer's split_special_tokens=False): build.special_tokens_in_text: special (text: test_special_text.py)
    config = load_config("chat", configs, {"pack.overlong": overlong, "build.batch_rows": 5,
                                           "build.special_tokens_in_text": "special"})
    result = build(config, tmp_path / "cache", log=lambda *_: None, progress=False)
    blocks = []
    for shard in sorted(result.path.glob("train-*.arrow")):
        ids, masks, doc_lens = open_shard(shard, BLOCK).arrays()
        for row, mask, lens in zip(ids, masks, doc_lens):
            n = int(sum(lens))
            blocks.append((row[:n].tolist(), mask[:n].tolist(), [int(x) for x in lens]))
    return blocks, json.loads((result.path / "report.json").read_text())


def trl_blocks(tokenizer_dir, chats: list, bad: set[int], strategy: str) -> list[tuple[list, list, list]]:
    """The TRL way, with the documented differences applied to its documents before packing."""
    import datasets
    from transformers import AutoTokenizer
    from trl import pack_dataset

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    newline = tokenizer.encode("\n", add_special_tokens=False)
    ids, masks = [], []
    for k, messages in enumerate(chats):
        out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        doc, mask = list(out["input_ids"]), list(out["assistant_masks"])
        if k in bad:
            continue
        assert doc[-2:] == [tokenizer.eos_token_id, *newline] and mask[-1] == 0  # the newline after the last turn
        doc, mask = doc[:-1], mask[:-1]
        assert mask[0] == 0  # a document's first token is never a target in packtrain; nor an assistant token here
        ids.append(doc)
        masks.append(mask)
    datasets.disable_progress_bars()
    dataset = datasets.Dataset.from_dict({"input_ids": ids, "assistant_masks": masks})
    packed = pack_dataset(dataset, BLOCK, strategy=strategy, map_kwargs={"batch_size": len(dataset)})
    blocks = []
    for row in packed:
        mask, at = list(row["assistant_masks"]), 0
        for n in row["seq_lengths"]:
            assert any(mask[at: at + n])  # packtrain drops a piece with no supervised token; none here
            mask[at], at = 0, at + n  # the first token of a piece is never a target (a split one's may be TRL's)
        blocks.append((row["input_ids"], mask, row["seq_lengths"]))
    return blocks


@pytest.mark.parametrize("overlong, strategy", [("truncate", "bfd"), ("split", "bfd_split")])
def test_packed_conversations_are_the_blocks_trl_makes(tmp_path, tokenizer_dir, overlong, strategy):
    chats = conversations()
    blocks, report = packtrain_blocks(tmp_path, tokenizer_dir, chats, overlong)
    bad = report["sources"][0]["first_bad_rows"]
    assert [row["row"].rsplit("#", 1)[1] for row in bad] == ["13"]
    assert "the assistant turn starting '\\nSELECT 1<|im_end|>' starts inside a token" in bad[0]["reason"]
    assert report["train"][{"truncate": "truncated", "split": "split"}[overlong]] == 1
    assert report["train"]["documents"] == len(chats) - 1
    expected = trl_blocks(tokenizer_dir, chats, {13}, strategy)
    assert len(expected) > 3 and any(len(lens) > 2 for _, _, lens in expected)  # blocks shared by several documents
    assert [lens for _, _, lens in blocks] == [lens for _, _, lens in expected]
    for k, (got, want) in enumerate(zip(blocks, expected)):
        assert got[0] == want[0], f"block {k}: input_ids differ"
        assert got[1] == want[1], f"block {k}: loss_mask differs from assistant_masks"
