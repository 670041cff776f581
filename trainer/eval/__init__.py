"""Evaluation: what a run is measured by (installed as ``packtrain.trainer.eval``).

- ``evaluate.py``: the eval loss and perplexity over the build's val blocks, by the training's own
  micro-step (trainer/step.py), during and before training;
- ``generate.py``: batched greedy generation from the base model and from the adapter;
- ``task_eval.py``: the adapter's answers to the build's validation prompts against the base model's,
  scored (``eval.json``, ``eval.jsonl``), and the samples every run ends with;
- ``task_metrics.py``: the per-expert metrics, pure functions;
- ``eval_run.py``: ``packtrain eval``, the task evaluation of a finished run afterwards.
"""
