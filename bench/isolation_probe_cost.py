"""What the run-start isolation probe (trainer/run/isolation.py) costs against one training block's forward
(docs/BENCHMARKS.md, 'Training on a CPU').

A SmolLM2-135M-shaped Llama (hidden 576, 30 layers, 9 heads, 3 KV heads, vocabulary 49,152; random weights: the
cost does not depend on them), fp32 on the CPU, one torch thread: the probe five times after a warm-up (its
three forwards of 36, 9 and 6 tokens), then one 2048-token packed forward in train mode, as a step makes it.

    .venv/bin/python -P bench/isolation_probe_cost.py
"""

import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from packtrain.trainer.model.model import packed_forward
from packtrain.trainer.run.isolation import probe

torch.set_num_threads(1)
config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                     tie_word_embeddings=True, use_cache=False)
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
cpu = torch.device("cpu")
probe(model, cpu, None)
times = []
for _ in range(5):
    start = time.perf_counter()
    result = probe(model, cpu, None)
    times.append(time.perf_counter() - start)
model.train()
ids = torch.randint(0, config.vocab_size, (1, 2048))
start = time.perf_counter()
packed_forward(model, ids, torch.arange(2048)[None])
block = time.perf_counter() - start
print(f"probe: min {min(times):.3f} s, max {max(times):.3f} s ({result}); one 2048-token forward {block:.2f} s; "
      f"probe / forward {min(times) / block:.3f}")
