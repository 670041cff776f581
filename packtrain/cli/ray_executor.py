"""``packtrain pretokenize --executor ray``: what needs no Ray is checked and done first (ray is not
installed, a bad address or cache path: one line; an up-to-date build reused without importing ray,
which alone takes over a second), then pipeline/orchestrate/ray_build.py builds the stages that have work."""

from __future__ import annotations

import contextlib
import importlib.util
import json

import click

from packtrain.cli.prepare import ensure_converted

NO_RAY = "--executor ray needs Ray: pip install 'packtrain[ray]' (`make install` does)"


def pretokenize_on_ray(cfg, cache_dir, address: str | None, parts: int | None, progress: bool) -> None:
    from packtrain.core.contract import expert_dir
    from packtrain.pipeline.orchestrate.build import build, plan
    from packtrain.pipeline.orchestrate.ray_address import check_cache_dir, check_reachable

    if importlib.util.find_spec("ray") is None:
        raise click.UsageError(NO_RAY)
    check_cache_dir(cache_dir, address)
    if address is not None:
        check_reachable(address)  # before anything is converted or written
    ensure_converted(cfg)
    with contextlib.ExitStack() as stack:
        cluster = None
        for stage in cfg.stage_configs():
            planned = plan(stage, cache_dir, click.echo)
            if (expert_dir(cache_dir, stage.expert) / planned.build_id).is_dir():  # checked and reused: no Ray
                result = build(stage, cache_dir, log=click.echo, progress=progress, planned=planned)
            else:
                ray_build = ray_build_module()
                if cluster is None:  # started (or joined) once, for the first stage that has work
                    cluster = stack.enter_context(ray_build.RayCluster(address, cfg.build.processes(), log=click.echo))
                result = ray_build.build_on_ray(stage, cache_dir, cluster, parts, log=click.echo, progress=progress,
                                                prepare=ensure_converted, planned=planned)
            click.echo(json.dumps({"expert": stage.expert, "build_id": result.build_id,
                                   "up_to_date": result.up_to_date, "path": str(result.path)}))


def ray_build_module():
    """pipeline/orchestrate/ray_build.py, which imports ray (packtrain[ray])."""
    try:
        from packtrain.pipeline.orchestrate import ray_build
    except ModuleNotFoundError as e:
        if e.name != "ray":
            raise
        raise click.UsageError(NO_RAY) from None
    return ray_build
