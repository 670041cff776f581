"""What rendering turn by turn costs against the one-render shortcut (docs/DATASETS.md, format.tools).

30,000 two-exchange conversations from the bundled sql sample, built without format.tools (rendered once,
where proven) and with it, every row's tools [] (the same text under Qwen2.5's template, but every row
rendered turn by turn); Qwen3's real tokenizer with Qwen2.5's template, num_proc 2, the fast-encoder
decision remembered. Whole `packtrain pretokenize` commands, alternated, 3 each; the shards compared.

    .venv/bin/python -P bench/render_once_cost.py
"""

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from real_tokenizers import make_real_tokenizer
root = Path(tempfile.mkdtemp(prefix="render-once-bench-")); tok = root / "qwen3"
if not tok.exists():
    make_real_tokenizer("qwen3", tok)
tok25 = root / "qwen2_5"  # Qwen3's tokenizer with Qwen2.5's template (ChatML, renders once where proven)
if not tok25.exists():
    shutil.copytree(tok, tok25)
    c = json.loads((tok25 / "tokenizer_config.json").read_text())
    c["chat_template"] = (ROOT / "tests" / "chat_templates" / "qwen2_5.jinja").read_text()
    (tok25 / "tokenizer_config.json").write_text(json.dumps(c))
tok = tok25
src = [json.loads(l) for l in gzip.open(ROOT / "pipeline" / "assets" / "samples" / "sql.jsonl.gz", "rt", encoding="utf-8")]
rows = []
for i in range(30000):
    a, b = src[i % len(src)], src[(i * 7 + 1) % len(src)]
    rows.append({"messages": [{"role": "user", "content": f"{a['context']}\n{a['question']} ({i})"},
                              {"role": "assistant", "content": a["answer"]},
                              {"role": "user", "content": b["question"]}, {"role": "assistant", "content": b["answer"]}],
                 "tools": "[]"})
(root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
base = {"style": "chat", "messages": "messages"}
def config(fmt, name):
    import yaml

    d = root / "configs"; d.mkdir(exist_ok=True)
    (d / f"{name}.yaml").write_text(yaml.safe_dump({"expert": name, "sources": [{"name": str(root / "chats.jsonl")}],
        "format": fmt, "pack": {"block_size": 2048}, "build": {"num_proc": 2}, "model": {"name": str(tok)}}))
config(base, "once"); config({**base, "tools": "tools"}, "turns")  # tools [] : the same text, turn by turn
cache = root / "cache"
shutil.rmtree(cache, ignore_errors=True)
def run(name):
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-P", "-m", "packtrain.cli", "pretokenize", name, "--configs-dir", str(root / "configs"),
                        "--cache-dir", str(cache)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return time.monotonic() - t
run("once"); shutil.rmtree(cache / "once")  # the encoder decision made once, remembered for both
for name in ("once", "turns", "once", "turns", "once", "turns"):
    s = run(name)
    build = next(d for d in (cache / name).iterdir() if d.is_dir() and not d.name.startswith("."))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(build.glob("*.arrow")))).hexdigest()[:12]
    shutil.rmtree(cache / name)
    print(f"{name}: {s:.1f} s, shards {digest}")
shutil.rmtree(root)
