"""PNG plots of a run (from metrics.jsonl) and of a build (from report.json), `packtrain plot`, and
``train.report_to: tensorboard`` (event files beside metrics.jsonl, which stays the record)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from packtrain.cli.commands import main
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.review.plots import write_build_plots
from packtrain.core.plotting import PlotError
from packtrain.trainer.report.plots import write_run_plots
from packtrain.trainer.run.train import run
from build_fixtures import make_project
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN_PLOTS = ["data_wait.png", "loss.png", "memory.png", "throughput.png"]


def assert_png(path, width, height):
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert matplotlib.image.imread(path).shape[:2] == (height, width)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def test_a_run_ends_with_its_plots_and_tensorboard_events(tmp_path, model_dir):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, eval_steps=2, sample_prompts=0, plots=True,
                         report_to="tensorboard")
    run_dir = run(config, tmp_path / "cache")

    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == RUN_PLOTS
    for name in RUN_PLOTS:
        assert_png(run_dir / "plots" / name, 700, 400)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval/loss" in r]
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([r["loss"] for r in train], rel=1e-6)  # float32
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("eval/loss")] == [0, 2, 4] == [r["step"] for r in evals]
    assert {"tok_s", "data_wait", "mem/peak_gib", "lr", "grad_norm"} <= set(events.Tags()["scalars"])


def test_tensorboard_missing_or_plots_off(tmp_path, model_dir, monkeypatch):
    import sys

    from packtrain.core.config import ConfigError

    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, report_to="tensorboard", plots=False)
    with pytest.raises(ConfigError, match=r"^train.report_to: tensorboard needs the tensorboard package: "
                                          r"pip install 'packtrain\[tensorboard\]', or set train.report_to: none$"):
        run(config, tmp_path / "cache")
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made
    monkeypatch.undo()
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=1, plots=False), tmp_path / "cache")
    assert not (run_dir / "plots").exists() and not (run_dir / "tensorboard").exists()


def test_run_plots_need_a_metrics_file(tmp_path):
    with pytest.raises(PlotError, match="metrics.jsonl does not exist: not a run directory"):
        write_run_plots(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 3, "skipped": "non-finite loss"}\n{"torn": \n')
    with pytest.raises(PlotError, match="has no training step to plot"):
        write_run_plots(tmp_path)


def test_build_plots_and_the_plot_command(tmp_path):
    pytest.importorskip("matplotlib")
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"])
    result = build(config, project["cache"], log=lambda line: None, progress=False)
    written = write_build_plots(result.path)
    assert [p.name for p in written] == ["lengths.png", "sources.png", "packing.png"]
    assert_png(result.path / "plots" / "lengths.png", 800, 400)
    assert_png(result.path / "plots" / "sources.png", 900, 400)
    assert_png(result.path / "plots" / "packing.png", 600, 400)

    # the command: the build's plots, and the newest run's
    run_dir = tmp_path / "runs" / "sql" / "run1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "loss": 2.0, "tok_s": 100.0, "sup_tok_s": 40.0, "data_wait": 0.1, "mem/peak_gib": 1.5},
        {"step": 2, "loss": 1.5, "tok_s": 120.0, "sup_tok_s": 50.0, "data_wait": 0.05, "mem/peak_gib": 1.5},
        {"step": 2, "eval/loss": 1.7, "eval/ppl": 5.47, "eval/tokens": 10}]))
    out = CliRunner().invoke(main, ["plot", "sql", "--cache-dir", str(project["cache"]),
                                    "--runs-dir", str(tmp_path / "runs")])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == [str(result.path / "plots" / n) for n in ("lengths.png", "sources.png",
                                                                                "packing.png")] + [
        str(run_dir / "plots" / n) for n in ("loss.png", "throughput.png", "data_wait.png", "memory.png")]
    assert_png(run_dir / "plots" / "loss.png", 700, 400)


@pytest.mark.parametrize("line, problem", [
    ('{"step": 1, "loss": "abc"}', "line 2: loss is 'abc', expected a number"),
    ('{"loss": 1.0}', "line 2: step is None, expected an integer >= 0"),
    ('{"step": 1.5, "loss": 1.0}', "line 2: step is 1.5, expected an integer >= 0"),
    ('{"step": 2, "eval/loss": [1]}', "line 2: eval/loss is [1], expected a number"),
    ('{"step": 2, "loss": 1.0, "tok_s": "fast"}', "line 2: tok_s is 'fast', expected a number"),
])
def test_a_damaged_metrics_line_is_named(tmp_path, line, problem):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n' + line + "\n")
    with pytest.raises(PlotError) as error:
        write_run_plots(tmp_path)
    assert str(error.value) == (f"{tmp_path / 'metrics.jsonl'} {problem}; the file is damaged: repair or delete "
                                "that line (the run's plots are drawn from it)")


def test_plot_refuses_a_run_that_is_a_file_a_damaged_report_and_missing_matplotlib(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PlotError, match="afile is a file, not a run directory: name a run directory"):
        write_run_plots(tmp_path / "afile")
    project = make_project(tmp_path)
    result = build(load_config("sql", project["configs"]), project["cache"], log=lambda line: None, progress=False)
    report = json.loads((result.path / "report.json").read_text())
    plot = ["plot", "sql", "--cache-dir", str(project["cache"]), "--runs-dir", str(tmp_path / "runs")]

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "matplotlib", None)  # not installed
        missing = CliRunner().invoke(main, plot)
    assert missing.exit_code != 0
    assert str(missing.exception) == "plots need matplotlib: pip install 'packtrain[plots]' (make install does)"

    for damage, problem in [({"train": {**report["train"], "length_histogram": [1, 2]}},
                             "field train.length_histogram is [1, 2], expected an object"),
                            ({"sources": [{"name": "x"}]}, "field sources[0].documents is missing")]:
        (result.path / "report.json").write_text(json.dumps({**report, **damage}))
        damaged = CliRunner().invoke(main, plot)
        assert damaged.exit_code != 0
        assert str(damaged.exception) == (
            f"{result.path / 'report.json'} is damaged ({problem}); rebuild it: delete {result.path} and run "
            "`packtrain pretokenize` (the plots are drawn from it)")
    assert not (result.path / "plots").exists()


def test_a_plots_path_that_is_a_file_is_refused_and_kept(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (tmp_path / "plots").write_text("my notes")
    with pytest.raises(PlotError) as error:
        write_run_plots(tmp_path)
    assert str(error.value) == f"{tmp_path / 'plots'} is a file, not the plots directory: move it away to draw the plots"
    assert (tmp_path / "plots").read_text() == "my notes"


def drawn(monkeypatch, module) -> dict:
    """The figures ``module`` saves, by file name: each axis's tick labels and limits, and every text's
    extent as rendered (checked before the figure is closed)."""
    figures = {}
    save = module.save_figure

    def capture(plt, fig, path):
        fig.canvas.draw()  # places the axis labels beside their tick labels
        renderer = fig.canvas.get_renderer()
        texts = [t for ax in fig.axes for t in (*shown_ticks(ax), *ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label)
                 if t.get_text()]
        texts += [t for t in [getattr(fig, "_suptitle", None)] if t is not None and t.get_text()]
        figures[path.name] = {
            "suptitle": fig.get_suptitle(), "title": fig.axes[0].get_title(),
            "xticks": [t.get_text() for t in fig.axes[0].get_xticklabels()],
            "yticks": [t.get_text() for t in fig.axes[0].get_yticklabels()],
            "ylim": fig.axes[0].get_ylim(), "ylabel": fig.axes[0].get_ylabel(),
            "boxes": [(t.get_text(), t.get_window_extent(renderer)) for t in texts], "figure": fig.bbox}
        return save(plt, fig, path)

    monkeypatch.setattr(module, "save_figure", capture)
    return figures


def shown_ticks(ax) -> list:
    """The tick labels drawn: those of ticks inside the axis's view (matplotlib keeps one beyond each end)."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    return ([t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
            + [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1])


def overlapping(figure: dict) -> list:
    """Pairs of texts whose rendered boxes overlap, and texts that leave the figure."""
    boxes = figure["boxes"]
    pairs = [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]
    outside = [(text, "outside") for text, box in boxes
               if not (figure["figure"].x0 <= box.x0 and box.x1 <= figure["figure"].x1
                       and figure["figure"].y0 <= box.y0 and box.y1 <= figure["figure"].y1)]
    return pairs + outside


def write_report(build_dir, sources):
    build_dir.mkdir(parents=True)
    histogram = {"<=128": 7, "<=256": 3, "<=512": 1, "<=64": 12, ">512": 2}  # report.json's keys: sorted as strings
    split = {"length_histogram": histogram, "tokens": 900, "padding_tokens": 100, "packing_efficiency": 0.9}
    (build_dir / "report.json").write_text(json.dumps({"expert": "sql", "build_id": "0123456789abcdef",
                                                       "train": split, "val": split, "sources": sources}))


def test_build_plots_sort_lengths_and_keep_every_label_apart(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import packtrain.pipeline.review.plots as plots

    many = [{"name": f"/data/team/experts/sql/{name}-with-a-long-name.jsonl", "documents": 1000 * (i + 1),
             "tokens": 123456 * (i + 1)} for i, name in enumerate(["spider", "wikisql", "bird", "sparc", "cosql"])]
    write_report(tmp_path / "many", many)
    write_report(tmp_path / "one", [{"name": "b-mc2/sql-create-context", "documents": 78577, "tokens": 9876543}])
    figures = drawn(monkeypatch, plots)
    write_build_plots(tmp_path / "many")
    assert figures["lengths.png"]["xticks"] == ["<=64", "<=128", "<=256", "<=512", ">512"]
    assert figures["sources.png"]["yticks"][0] == ("/data/team/experts/sql/spider-with-\na-long-name.jsonl\n"
                                                   "1,000 documents, 123,456 tokens")  # wrapped after a '-' or '/'
    assert {name: overlapping(figure) for name, figure in figures.items()} == {
        "lengths.png": [], "sources.png": [], "packing.png": []}
    write_build_plots(tmp_path / "one")
    assert figures["sources.png"]["yticks"] == ["b-mc2/sql-create-context\n78,577 documents, 9,876,543 tokens"]
    assert overlapping(figures["sources.png"]) == []


def test_run_plots_start_at_zero_and_say_which_memory(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import packtrain.trainer.report.plots as plots

    figures = drawn(monkeypatch, plots)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "loss": 2.0, "tok_s": 1000.0, "data_wait": 0.010, "mem/peak_gib": 1.50},
        {"step": 2, "loss": 1.5, "tok_s": 1010.0, "data_wait": 0.011, "mem/peak_gib": 1.51}]))
    (tmp_path / "run.json").write_text(json.dumps({"device": "cpu"}))
    write_run_plots(tmp_path)
    assert figures["data_wait.png"]["ylim"] == (0, 100)
    assert figures["throughput.png"]["ylim"][0] == figures["memory.png"]["ylim"][0] == 0
    assert figures["memory.png"]["ylabel"] == "peak CPU memory, RSS (GiB)"
    (tmp_path / "run.json").write_text(json.dumps({"device": "cuda:0"}))
    write_run_plots(tmp_path)
    assert figures["memory.png"]["ylabel"] == "peak GPU memory allocated (GiB)"


def test_run_plots_are_titled_by_the_expert_with_the_run_id_smaller(tmp_path, monkeypatch):
    """Issue 47: the title was the run id alone (``20261206-101500: loss``)."""
    pytest.importorskip("matplotlib")
    import packtrain.trainer.report.plots as plots

    figures = drawn(monkeypatch, plots)
    run_dir = tmp_path / "runs" / "somewhere" / "20261206-101500"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "loss": 2.0, "tok_s": 1000.0, "data_wait": 0.010, "mem/peak_gib": 1.50},
        {"step": 2, "loss": 1.5, "tok_s": 1010.0, "data_wait": 0.011, "mem/peak_gib": 1.51}]))
    (run_dir / "config.json").write_text(json.dumps({"expert": "neo4j"}))
    (run_dir / "run.json").write_text(json.dumps({"device": "cpu"}))
    write_run_plots(run_dir)
    assert {name: (f["suptitle"], f["title"]) for name, f in figures.items()} == {
        "loss.png": ("neo4j: loss", "run 20261206-101500"),
        "throughput.png": ("neo4j: tokens/s", "run 20261206-101500"),
        "data_wait.png": ("neo4j: time waiting for data (%)", "run 20261206-101500"),
        "memory.png": ("neo4j: peak CPU memory, RSS (GiB)", "run 20261206-101500")}
    assert {name: overlapping(figure) for name, figure in figures.items()} == {name: [] for name in RUN_PLOTS}
    boxes = dict(figures["loss.png"]["boxes"])
    assert boxes["run 20261206-101500"].height < boxes["neo4j: loss"].height  # the run id smaller
    assert boxes["run 20261206-101500"].y1 <= boxes["neo4j: loss"].y0  # under the expert's title
    (run_dir / "config.json").unlink()  # unreadable: the directory the run is in names the expert
    write_run_plots(run_dir)
    assert figures["loss.png"]["suptitle"] == "somewhere: loss"


def test_train_draws_the_plots_of_the_build_it_trained_on(tmp_path, monkeypatch):
    """Issue 47: ``train`` drew the run's plots only; the build's waited for `packtrain plot`. The trainer
    is a stand-in here (the run's own plots: test_a_run_ends_with_its_plots_and_tensorboard_events)."""
    pytest.importorskip("matplotlib")
    import packtrain.trainer.run.curriculum as curriculum
    from inprocess_cli import cli

    project = make_project(tmp_path)
    result = build(load_config("sql", project["configs"]), project["cache"], log=lambda line: None, progress=False)
    run_dir = tmp_path / "runs" / "sql" / "run1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"build_id": result.build_id, "build_dir": str(result.path)}))

    def trained(config, cache_dir, on_stage_done, **options):
        on_stage_done(config.expert, run_dir)
        return [run_dir]

    monkeypatch.setattr(curriculum, "train_expert", trained)
    args = ["train", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"]]
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    plots = [result.path / "plots" / name for name in ("lengths.png", "sources.png", "packing.png")]
    assert f"build plots: {', '.join(map(str, plots))}" in done.stderr.splitlines()
    assert json.loads(done.stdout.splitlines()[-1])["run_dir"] == str(run_dir)
    assert_png(plots[0], 800, 400)
    import packtrain.pipeline.review.plots as build_plots

    drawn = []
    monkeypatch.setattr(build_plots, "write_build_plots", lambda path: drawn.append(path) or [])
    again = cli(*args)  # the build never changes: its plots are drawn once, by its first run
    assert again.returncode == 0 and drawn == []
    assert f"build plots: {', '.join(map(str, plots))} (drawn before)" in again.stderr.splitlines()
    result.path.joinpath("report.json").touch()  # older than the report: drawn again
    os.utime(plots[1], ns=(0, 0))
    assert cli(*args).returncode == 0 and drawn == [result.path]
    monkeypatch.undo()
    monkeypatch.setattr(curriculum, "train_expert", trained)
    for plot in plots:
        plot.unlink()
    off = cli(*args, "--set", "train.plots=false")
    assert off.returncode == 0 and "build plots" not in off.stderr and not any(p.exists() for p in plots)
    (run_dir / "run.json").write_text("{}")  # a run that names no build: said, the run is done all the same
    done = cli(*args)
    assert done.returncode == 0
    assert (f"no build plots: {run_dir / 'run.json'} names no build (`packtrain plot sql --cache-dir "
            f"{project['cache']}` draws them)" in done.stderr.splitlines())
