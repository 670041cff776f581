"""How the command line's options become a config: the options the commands share, the config each
command resolves from them (``resolve``), and the parameter types of their own."""

from __future__ import annotations

import functools
import math
from typing import Literal

import click

from packtrain.core.config import ConfigError
from packtrain.core.contract import CACHE_DIR_ENV
from packtrain.core.errors import cut, quote
from packtrain.core.hints import FLAGS, given
from packtrain.core.configfile import apply_cli_overrides, load_as_written_and_trained, load_config, load_for_machine

class Remembered(click.Command):
    """A command whose hints repeat the options it was given (--cache-dir, --configs-dir, --runs-dir,
    --dataset, --model, --set) in the form the user ran it (packtrain/core/hints.py)."""

    def invoke(self, ctx: click.Context):
        with given(**{key: value for key, value in ctx.params.items() if key in FLAGS or key == "expert"}):
            return super().invoke(ctx)


cache_dir_option = click.option(
    "--cache-dir", default="cache", show_default=True, type=click.Path(file_okay=False), envvar=CACHE_DIR_ENV,
    help="Where builds live: <cache-dir>/<expert>/<build-id>/.")


def expert_options(f):
    f = click.option("--configs-dir", default="configs", show_default=True, type=click.Path(file_okay=False),
                     help="Directory of <expert>.yaml files.")(f)
    f = cache_dir_option(f)
    f = click.option("--dataset", default=None, help="Use this source instead of the config's: an HF dataset id "
                     "from the local HF caches, or a local path.")(f)
    f = click.option("--model", default=None,
                     help="Model (and so tokenizer): 'smollm2-135m' (the embedded pretrained base), an HF id from "
                     "the local hub cache, a local directory, or 'bundled' (random-init demo).")(f)
    f = click.option("--num-proc", type=int, default=None,
                     help="Tokenizer processes (default: the config's, auto: one a CPU, at most 8).")(f)
    f = click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="Override any config field, e.g. --set pack.block_size=1024 (YAML value).")(f)
    return f


def with_config(for_training: bool = False, as_trained: bool = False):
    """The preamble of every command that works on one expert's config: the command takes EXPERT and
    the shared options (:func:`expert_options`) and is called with ``cfg``, EXPERT's config resolved
    from them (:func:`resolve`), ``cache_dir`` and its own options. ``for_training``: the config as
    this machine trains it, and ``notes`` (a list) holding the cpu profile's line when it applied.
    ``as_trained``: ``cfg`` as written, and ``trained``, the config as this machine trains it."""
    def decorate(command):
        @functools.wraps(command)
        def resolved(expert, configs_dir, cache_dir, dataset, model, num_proc, settings, **own):
            if as_trained:
                written, trained = resolve(expert, configs_dir, dataset, model, num_proc, settings, "both")
                return command(written, cache_dir, trained=trained, **own)
            if not for_training:
                return command(resolve(expert, configs_dir, dataset, model, num_proc, settings), cache_dir, **own)
            notes: list[str] = []
            cfg = resolve(expert, configs_dir, dataset, model, num_proc, settings, "trained",
                          on_profile=notes.append)
            return command(cfg, cache_dir, notes=notes, **own)

        return click.argument("expert")(expert_options(resolved))
    return decorate


def resolve(expert, configs_dir, dataset, model, num_proc, settings,
            form: Literal["written", "trained", "both"] = "written", on_profile=None):
    """EXPERT's config with the command line's overrides. ``written``: as written, for the build commands
    (a build never depends on the machine); ``trained``: as this machine trains it, the ``cpu`` profile
    applied without a CUDA GPU, and then ``on_profile(line)`` called with the line that says so;
    ``both``: (as written, as this machine trains it)."""
    import yaml

    from packtrain.core.yaml_reader import load_yaml

    overrides = apply_cli_overrides(dataset=dataset, model=model, num_proc=num_proc)
    labels = {"sources": f"--dataset {dataset}", "model.name": f"--model {model}", "build.num_proc": f"--num-proc {num_proc}"}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{quote(item)}: expected KEY=VALUE, e.g. pack.block_size=1024", param_hint="--set")
        try:
            overrides[key] = load_yaml(value)
            labels[key] = f"--set {item}"
        except yaml.YAMLError as e:
            from packtrain.core.inputs import one_line

            raise ConfigError(f"--set {cut(item, 200)}: the value is not valid YAML ({one_line(e)}); quote it, "
                              f"e.g. --set '{key}=\"...\"'") from None
    if form == "both":
        return load_as_written_and_trained(expert, configs_dir, overrides, labels)
    if form == "written":
        return load_config(expert, configs_dir, overrides, labels)
    config, profiled = load_for_machine(expert, configs_dir, overrides, labels)
    if profiled and on_profile is not None:
        on_profile(config.cpu_note())
    return config


class DocumentCount(click.ParamType):
    """``--tokens``' value: a number of documents, or every one (``all``, 0, or the option alone)."""

    name = "N|all"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text in ("all", "0"):
            return 0
        if text.isdigit():
            return int(text)
        self.fail(f"{value!r} is not a number of documents (or 'all'); the expert comes first: "
                  "`packtrain verify sql --tokens 1000`", param, ctx)


class FiniteRange(click.FloatRange):
    """A float option's type: in the range, as ``click.FloatRange`` checks it, and finite (``nan`` passes every
    comparison, so FloatRange alone takes it: ``--temperature nan`` sampled nothing and said nothing)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number in the range {self._describe_range()}", param, ctx)
        return number
