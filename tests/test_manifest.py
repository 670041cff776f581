"""The typed manifest the build constructs and writes (packtrain/core/contract.py Manifest.create)."""

from __future__ import annotations

import pytest

from packtrain.core.contract import Manifest, SplitTotals, TokenizerEntry
from packtrain.core.errors import ContractError
from packtrain.pipeline.pack.spill import write_json

SHA = "ab" * 32
TOTALS = {"documents": 3, "tokens": 40, "supervised_tokens": 12, "blocks": 2, "padding_fraction": 0.375}
INPUTS = {"format_version": 1, "pipeline_version": 5, "on_bad_rows": "skip", "format": {"style": "template"},
          "sources": [{"source": {"name": "bundled", "hash": SHA}}], "pack": {"block_size": 32, "val_fraction": 0.5},
          "tokenizer": {"source": "bundled", "hash": SHA, "files": {"tokenizer.json": SHA}, "vocab_size": 300,
                        "eos_id": 0, "pad_id": 1, "bos_id": None, "prefix_ids": [2]}}
OUTPUTS = {"token_dtype": "uint16", "totals": {"train": TOTALS, "val": {**TOTALS, "blocks": 1}},
           "shards": {"train": [{"file": "train-00000.arrow", "rows": 2, "bytes": 900, "sha256": SHA}], "val": []}}

WRITTEN = """{
  "build_id": "0123456789abcdef",
  "expert": "sql",
  "format_version": 1,
  "inputs": {
    "format": {
      "style": "template"
    },
    "format_version": 1,
    "on_bad_rows": "skip",
    "pack": {
      "block_size": 32,
      "val_fraction": 0.5
    },
    "pipeline_version": 5,
    "sources": [
      {
        "source": {
          "hash": "HASH",
          "name": "bundled"
        }
      }
    ],
    "tokenizer": {
      "bos_id": null,
      "eos_id": 0,
      "files": {
        "tokenizer.json": "HASH"
      },
      "hash": "HASH",
      "pad_id": 1,
      "prefix_ids": [
        2
      ],
      "source": "bundled",
      "vocab_size": 300
    }
  },
  "outputs": {
    "shards": {
      "train": [
        {
          "bytes": 900,
          "file": "train-00000.arrow",
          "rows": 2,
          "sha256": "HASH"
        }
      ],
      "val": []
    },
    "token_dtype": "uint16",
    "totals": {
      "train": {
        "blocks": 2,
        "documents": 3,
        "padding_fraction": 0.375,
        "supervised_tokens": 12,
        "tokens": 40
      },
      "val": {
        "blocks": 1,
        "documents": 3,
        "padding_fraction": 0.375,
        "supervised_tokens": 12,
        "tokens": 40
      }
    }
  }
}
""".replace("HASH", SHA)


def test_the_build_writes_the_manifest_it_constructs_and_reads_it_back(tmp_path):
    manifest = Manifest.create("0123456789abcdef", "sql", INPUTS, OUTPUTS)
    build_dir = tmp_path / "0123456789abcdef"
    build_dir.mkdir()
    write_json(build_dir / "manifest.json", manifest.to_dict())
    assert (build_dir / "manifest.json").read_text() == WRITTEN
    assert Manifest.load(build_dir, full=True) == manifest
    assert manifest.tokenizer == TokenizerEntry("bundled", SHA, 300, 1, 0, {"tokenizer.json": SHA}, (2,))
    assert manifest.totals == {"train": SplitTotals(3, 40, 12, 2), "val": SplitTotals(3, 40, 12, 1)}
    assert (manifest.val_fraction, manifest.block_size, manifest.vocab_size, len(manifest.train)) == (0.5, 32, 300, 1)


def test_a_manifest_that_breaks_the_contract_is_never_written():
    with pytest.raises(ContractError, match=r"the build of 'sql' made a manifest that breaks the contract \(field outputs.totals.train.documents is missing\)"):
        Manifest.create("0123456789abcdef", "sql", INPUTS, {**OUTPUTS, "totals": {"train": {}, "val": {}}})
