"""``train.report_to: mlflow``: the run on MLflow (trainer/report/sinks.py), through ``mlflow-skinny``
(``pip install 'packtrain[mlflow]'``), as HF's ``MLflowCallback`` does it.

- ``MLFLOW_TRACKING_URI`` names the tracking server or store, ``MLFLOW_EXPERIMENT_NAME`` the
  experiment (default ``packtrain``, created when missing). mlflow-skinny talks to a server
  (``http://host:5000``); a local ``file:`` store also needs ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3
  refuses it otherwise), a local ``sqlite:`` store the full ``mlflow`` package.
- The MLflow run's name is the run directory's name; its params are the resolved config, one per
  field (``train.learning_rate``; a list or a mapping as its JSON), each cut to MLflow's value limit
  (``MAX_PARAM_VAL_LENGTH``, said in the log when one is cut).
- Every metrics line is one ``log_batch`` at its step, with the same names as in metrics.jsonl.
- The end: the run's status FINISHED, FAILED or KILLED.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("packtrain.train")

DEFAULT_EXPERIMENT = "packtrain"


def config_params(config: dict) -> dict[str, str]:
    """The config as MLflow params: ``section.field`` -> its value as text (a string as it is,
    anything else as JSON, its keys sorted as in config.json), so every key is a field name.

    >>> config_params({"expert": "sql", "train": {"learning_rate": 0.0002, "run_name": None},
    ...                "sources": [{"name": "bundled"}]})
    {'expert': 'sql', 'train.learning_rate': '0.0002', 'train.run_name': 'null', 'sources': '[{"name": "bundled"}]'}
    """
    params = {}
    for key, value in config.items():
        fields = value.items() if isinstance(value, dict) else [(None, value)]
        for name, field in fields:
            text = field if isinstance(field, str) else json.dumps(field, sort_keys=True)
            params[f"{key}.{name}" if name else key] = text
    return params


class MlflowSink:
    """One MLflow run per packtrain run, through ``MlflowClient`` (no global active run)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.run_id = None  # until the MLflow run is created

    def start(self, config: dict) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        self.client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_dir.name).info.run_id
        params = config_params(config)
        cut = [key for key, value in params.items() if len(value) > MAX_PARAM_VAL_LENGTH]
        if cut:
            log.info("report_to mlflow: %s cut to %d characters (MLflow's limit; config.json has them whole)",
                     ", ".join(cut), MAX_PARAM_VAL_LENGTH)
        batch = [Param(key, value[:MAX_PARAM_VAL_LENGTH]) for key, value in params.items()]
        for i in range(0, len(batch), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        log.info("report_to mlflow: run %s in experiment %r at %s", self.run_id, name, self.client.tracking_uri)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in metrics.items()])

    def finish(self, status: str) -> None:
        if self.run_id is None:  # its start failed before the run was created: nothing to end
            return
        self.client.set_terminated(self.run_id, status.upper())
