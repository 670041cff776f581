"""The lazy import boundary: a mistake that needs no model fails before torch, transformers or peft is
imported (they cost tens of seconds on a loaded CPU), and the commands that never need them
(--help, config, status, discover) never import them (packtrain/core/preflight.py). No command
here imports ray either: only `pretokenize --executor ray` does (pipeline/orchestrate/ray_build.py).

The commands run in one subprocess whose import system refuses those packages and records every
attempt, so the test says nothing about time, only about what was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import io, json, sys

HEAVY = {"torch", "transformers", "peft", "ray"}  # ray: only `pretokenize --executor ray` imports it
attempted = []


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY:
            attempted.append(name)
            raise ImportError(f"{name}: refused by the test")
        return None


sys.meta_path.insert(0, Refuse())
from packtrain.cli.commands import run

results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["packtrain", *argv]
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        run()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "imported": attempted[:]})
    attempted.clear()
print(json.dumps(results))
"""


def run_without_torch(commands: list[list[str]], cwd: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], cwd=cwd, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def test_what_needs_no_model_never_imports_torch(hf_home, tmp_path):
    configs, cache, runs = ROOT / "configs", tmp_path / "cache", tmp_path / "runs"
    common = ["--configs-dir", str(configs), "--cache-dir", str(cache)]
    (runs / "sql" / "stopped").mkdir(parents=True)  # a run stopped before its end: no summary.json
    looks = {"help": ["--help"], "config": ["config", "sql", *common], "status": ["status", *common],
             "discover": ["discover"]}  # commands that never need a model
    commands = {
        **looks,
        "train with no build": ["train", "json", *common],
        "eval with no finished run": ["eval", "sql", "--runs-dir", str(runs)],
        "eval of a missing run": ["eval", "sql", "--run", str(tmp_path / "nope")],
        "eval of an unfinished run": ["eval", "sql", "--run", str(runs / "sql" / "stopped")],
        "train of an unknown expert": ["train", "nope", *common],
        "train with a bad --set": ["train", "sql", *common, "--set", "train.learnig_rate=1"],
        # the embedded model is not converted (an empty PACKTRAIN_MODELS_DIR): the missing file is said first
        "pretokenize of a missing file": ["pretokenize", "sql", *common, "--model", "smollm2-135m",
                                          "--dataset", str(tmp_path / "nope.jsonl")],
        "a curriculum with --build-id": ["train", "sql", *common, "--set", "stages=[{name: a, sources: [{name: bundled}]}]",
                                         "--build-id", "0123456789abcdef"],
        "build the bundled sample": ["pretokenize", "sql", *common, "--no-progress"],
        "build a part of the bundled sample": ["pretokenize", "sql", *common, "--no-progress", "--part", "0/2"],
        "train from a missing checkpoint": ["train", "sql", *common, "--resume", str(tmp_path / "nope")],
        "train from a run with no complete checkpoint": ["train", "sql", *common, "--resume", str(runs / "sql" / "stopped")],
        "train a missing model directory": ["train", "sql", *common, "--model", str(tmp_path / "no-model")],
        "export of an unfinished run": ["export", "sql", "--run", str(runs / "sql" / "stopped"), "--out",
                                        str(tmp_path / "out"), "--merged"],
        "export into a directory that is not empty": ["export", "sql", "--run", str(runs / "sql" / "stopped"),
                                                      "--out", str(runs), "--merged"],
    }
    results = dict(zip(commands, run_without_torch(list(commands.values()), cwd=tmp_path)))
    assert {name: r["imported"] for name, r in results.items() if r["imported"]} == {}
    looked = [results.pop(name) for name in looks]
    assert [r["code"] for r in looked] == [0] * 4
    assert looked[0]["stdout"].startswith("Usage: packtrain [OPTIONS] COMMAND [ARGS]...")
    assert "lora:" in looked[1]["stdout"] and "sql" in looked[2]["stdout"]
    for name in ("build the bundled sample", "build a part of the bundled sample"):
        built = results.pop(name)
        assert built["code"] == 0, built["stderr"]
    errors = {name: (r["code"], r["stderr"]) for name, r in results.items()}
    assert errors == {
        "train with no build": (2, f"error: no build for expert 'json' in {cache / 'json'} (no CURRENT file); "
                                   f"run `packtrain pretokenize json --configs-dir {configs}` first\n"),  # cwd: tmp_path
        "eval with no finished run": (2, f"error: expert 'sql' has no finished run under {runs / 'sql'}: train it "
                                         "(`packtrain train sql`), or name a run directory with --run\n"),
        "eval of a missing run": (2, f"error: --run {tmp_path / 'nope'} does not exist: name a run directory "
                                     "(runs/sql/<run>) with --run\n"),
        "eval of an unfinished run": (2, f"error: --run {runs / 'sql' / 'stopped'} is not a finished run (no "
                                         f"summary.json): finish it with `packtrain train sql --resume "
                                         f"{runs / 'sql' / 'stopped'}`, or name another run with --run\n"),
        "train of an unknown expert": (2, f"error: no config for expert 'nope': {configs / 'nope.yaml'} does not "
                                          "exist (known experts: json, neo4j, sql, typescript); a new expert is a file of its "
                                          f"own: write {configs / 'nope.yaml'} (its sources: and format:, docs/CONFIG.md)\n"),
        "train with a bad --set": (2, errors["train with a bad --set"][1]),
        "pretokenize of a missing file": (2, f"error: dataset '{tmp_path / 'nope.jsonl'}': {tmp_path / 'nope.jsonl'}"
                                             " does not exist; check the path (or give an absolute one) in sources: "
                                             f"of {configs / 'sql.yaml'} / --dataset\n"),
        "a curriculum with --build-id": (2, "error: --build-id names one build, and a curriculum has one build per "
                                            "stage: leave it out\n"),
        "train from a missing checkpoint": (2, f"error: --resume {tmp_path / 'nope'}: {tmp_path / 'nope'} does not "
                                               "exist; name a checkpoint-<step>/ directory or a run directory holding "
                                               "one, or use --resume auto\n"),
        "train from a run with no complete checkpoint": (2, f"error: --resume {runs / 'sql' / 'stopped'}: no complete "
                                                            "checkpoint there (a checkpoint-<step>/ directory with "
                                                            "state.json, trainer_state.pt and adapter/, or a run "
                                                            "directory holding one); use --resume auto to take the "
                                                            "newest one\n"),
        "train a missing model directory": (2, f"error: model '{tmp_path / 'no-model'}': {tmp_path / 'no-model'} does "
                                               "not exist; check the path, or set model.name / --model to a directory "
                                               "holding config.json and the weights\n"),
        "export of an unfinished run": (2, f"error: --run {runs / 'sql' / 'stopped'} is not a finished run (no "
                                           f"summary.json): finish it with `packtrain train sql --resume "
                                           f"{runs / 'sql' / 'stopped'}`, or name another run with --run\n"),
        "export into a directory that is not empty": (2, f"error: --out {runs} is not empty: nothing was written; "
                                                         "name a new directory with --out (export never "
                                                         "overwrites)\n"),
    }
    assert errors["train with a bad --set"][1].startswith("error: invalid config (--set train.learnig_rate=1): "
                                                          "train.learnig_rate: unknown key (did you mean learning_rate?)")



def test_reading_a_shard_imports_no_pandas(tmp_path):
    """pyarrow's ``to_numpy`` imports pandas where it is installed (0.3 CPU s of every process that opens
    a shard: the trainer, inspect, verify): packtrain/core/shardfile.py views the buffers instead, and
    reads the same blocks."""
    import numpy as np

    from packtrain.core.shardfile import ShardWriter, open_shard
    from trainer_fixtures import pack_docs, random_blocks

    blocks = random_blocks(5, 16, 0)
    writer = ShardWriter(tmp_path, "train", 16, np.uint16, 0, 1 << 30, 2)
    for docs in blocks:
        writer.add(*pack_docs(docs, 16))
    (name,) = [shard["file"] for shard in writer.close()]
    script = ("import json, sys\nfrom packtrain.core.shardfile import open_shard\n"
              f"ids, mask, lens = open_shard({str(tmp_path / name)!r}, 16).arrays()\n"
              "print(json.dumps([ids.tolist(), mask.tolist(), lens, 'pandas' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    ids, mask, lens, pandas = json.loads(done.stdout)
    assert pandas is False
    want = open_shard(tmp_path / name, 16).arrays()
    assert (ids, mask, lens) == (want[0].tolist(), want[1].tolist(), want[2])
    assert [sum(doc_lens) for doc_lens in lens] == [sum(len(tokens) for tokens, _ in docs) for docs in blocks]
