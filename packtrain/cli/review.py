"""The commands that look at a build: ``inspect`` (a few packed blocks decoded), ``verify`` (every shard
against its checksum; with ``--tokens``, the token ids against the tokenizer installed here) and
``status`` (each expert's current build and last run). Their work is in pipeline/review/; commands.py
adds them to the ``packtrain`` group."""

from __future__ import annotations

import json
import sys

import click

from packtrain.cli.options import DocumentCount, Remembered, cache_dir_option, resolve
from packtrain.cli.prepare import ensure_names_converted
from packtrain.core import hints
from packtrain.core.contract import (Manifest, check_build_expert, check_shard_sizes, load_build_config, resolve_build,
                                     verify_checksums)
from packtrain.core.errors import ContractError


@click.command(cls=Remembered)
@click.argument("expert")
@cache_dir_option
@click.option("--build-id", default=None, help="A build id (default: CURRENT).")
@click.option("--split", type=click.Choice(["train", "val"]), default="train", show_default=True)
@click.option("--blocks", default=2, show_default=True, type=click.IntRange(min=1), help="How many blocks to show.")
@click.option("--dropped", is_flag=True, help="List the near-duplicates and validation matches the build "
              "found (build.dedup: near, build.decontaminate), each with the document it matches.")
def inspect(expert, cache_dir, build_id, split, blocks, dropped):
    """Decode a few packed blocks of EXPERT: document boundaries and supervised spans (⟦ ⟧)."""
    from packtrain.core.resolve import resolve_model_dir
    from packtrain.pipeline.review.inspect import dropped_documents, inspect_build

    build_dir = resolve_build(cache_dir, expert, build_id)
    check_build_expert(build_dir, Manifest.load(build_dir), expert)  # as train checks it
    if dropped:
        click.echo(dropped_documents(build_dir))
        return
    model_cfg = load_build_config(build_dir)["model"]
    ensure_names_converted({model_cfg["tokenizer"] or model_cfg["name"]})  # a build made on another machine
    tokenizer_dir = resolve_model_dir(model_cfg["tokenizer"] or model_cfg["name"], model_cfg.get("revision"))
    click.echo(inspect_build(build_dir, tokenizer_dir / "tokenizer.json", split, blocks, sys.stdout.isatty()))


@click.command(cls=Remembered)
@click.argument("expert")
@cache_dir_option
@click.option("--build-id", default=None, help="A build id (default: CURRENT).")
@click.option("--tokens", "documents", type=DocumentCount(), is_flag=False, flag_value="all", default=None,
              metavar="[N|all]",
              help="Also re-tokenize N whole documents (alone, 0 or 'all': every one) from their decoded text "
                   "with the model's tokenizer as installed here; exit 1 when any differs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Which documents --tokens N samples.")
@click.option("--configs-dir", default="configs", show_default=True, type=click.Path(file_okay=False),
              help="Directory of <expert>.yaml files (--tokens: the model whose tokenizer is used).")
@click.option("--model", default=None, help="--tokens: the model (and so tokenizer) instead of the config's.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="--tokens: override a config field, e.g. --set model.tokenizer=DIR.")
def verify(expert, cache_dir, build_id, documents, seed, configs_dir, model, settings):
    """Check every shard of EXPERT's build against the sha256 in its manifest; with --tokens, that the
    model's tokenizer installed here gives the build's token ids (docs/BUILD.md, "Checking a build's tokens")."""
    build_dir = resolve_build(cache_dir, expert, build_id)
    manifest = Manifest.load(build_dir, full=True)
    check_build_expert(build_dir, manifest, expert)  # as train checks it
    problems = verify_checksums(build_dir, manifest)
    if problems:
        raise ContractError(f"build {manifest.build_id} is corrupt:\n  " + "\n  ".join(problems)
                            + f"\nrebuild with {hints.command('pretokenize', expert)}")
    check_shard_sizes(build_dir, manifest)
    shards = len(manifest.train) + len(manifest.val)
    click.echo(f"build {manifest.build_id} of {expert}: {shards} shards, all checksums match")
    from packtrain.pipeline.pack.report import removed_line

    removed = removed_line(manifest.inputs, manifest.outputs, expert)
    if removed:
        click.echo(removed)
    if documents is None:
        return
    from packtrain.core.resolve import resolve_tokenizer_dir
    from packtrain.pipeline.review.verify_tokens import check_tokens, format_check

    # the config's model (the build's config as written); a curriculum stage <expert>.<stage> shares its expert's
    cfg = resolve(expert.partition(".")[0], configs_dir, None, model, None, settings)
    result = check_tokens(build_dir, manifest, resolve_tokenizer_dir(cfg.model), documents or None, seed)
    click.echo("\n".join(format_check(result, documents or None)))
    if not result.checked:  # nothing proven is not a pass
        raise ContractError(f"no document of build {manifest.build_id} could be re-tokenized (the reasons are above)")
    if result.differing:
        sys.exit(1)


@click.command(cls=Remembered)
@click.argument("experts", nargs=-1)
@click.option("--configs-dir", default="configs", show_default=True, type=click.Path(file_okay=False))
@cache_dir_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per expert instead of a table.")
def status(experts, configs_dir, cache_dir, as_json):
    """Each expert's current build, age, whether its inputs changed since, tokens and last run."""
    from packtrain.pipeline.orchestrate.rebuild import all_experts as list_experts
    from packtrain.pipeline.review.status import expert_status, format_status

    rows = [row for e in (experts or list_experts(configs_dir)) for row in expert_status(e, configs_dir, cache_dir)]
    click.echo("\n".join(json.dumps(r) for r in rows) if as_json else format_status(rows))
