"""Encoding: formatted documents -> token ids and loss masks, exactly as the model's HF tokenizer makes them.

- ``tokenizer_info.py``: what the build needs to know about a tokenizer (vocabulary size, special ids);
  ``tokenizer_facts.py`` remembers the facts only the loaded tokenizer knows.
- ``worker.py``: one batch of rows -> formatted documents -> ids and masks (in a worker process);
  ``shortcut_encode.py``: the documents a fast encoder or the line cache makes (a chat batch fastokens
  makes whole as arrays), ``assemble.py``: the documents as the spill's arrays.
- ``pool.py``: ``num_proc`` worker processes, results taken back in order; ``fork_server.py``: the
  server that loads the build's encoders once and forks the workers and the encoder decision's child.
- ``encoders.py``: a worker's encoders, built once per process: the HF tokenizer (the reference) and the
  shortcuts in ``fast/``: ``fastokens_encoder.py`` and ``tiktoken_encoder.py`` (fast exact encoders) and
  ``line_cache.py`` (repeated lines once); ``byte_spans.py`` places supervised spans on the tokens of
  the fast encoders, which give no character offsets.
- ``tokenizer_shape.py``: what a tokenizer.json's normalizer and pre-tokenizer do (Sequences by their steps),
  for the structural checks of the fast encoders and the line cache.
- ``fast/encoder_decision.py``: which fast encoder a tokenizer gets, proven in a child process beside the build,
  once per machine (``machine_notes.py``: the machine's store of proofs).
- ``fast/exactness.py``: every shortcut is admitted only by checking what it made against the reference.
- ``source_caches.py``: a build's sources tokenized into their source caches (pipeline/pack/spill.py).
  ``shortcut_choices.py``: which shortcuts a build takes, and which cached sources a since-refused one made.
- ``notes.py``: small remembered answers (decisions, refusals, facts) in the cache directory.
"""
