"""Issue 5, security: offline for real, no remote code unless asked, only safe loaders, names that
cannot escape their directories."""

from __future__ import annotations

import ast
import dataclasses
import os
import socket
from pathlib import Path

import pytest

from build_fixtures import make_project, make_tokenizer
from packtrain.pipeline.orchestrate.build import build
from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict, load_config
from packtrain.core.contract import expert_dir
from packtrain.core.expert_names import check_expert_name
from packtrain.core.errors import ContractError
from trainer_fixtures import RUN_END, make_config, tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]


class NetworkUsed(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch):
    """Every way to reach the network raises (and is recorded)."""
    attempts = []

    def refuse(name):
        def refused(*args, **kwargs):
            attempts.append((name, args[1:2] if name.startswith("socket.") else args[:1]))
            raise NetworkUsed(f"{name} called: packtrain must work offline")
        return refused

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    return attempts


def test_a_full_build_and_a_training_run_never_touch_the_network(tmp_path, no_network, monkeypatch):
    from packtrain.trainer.run.train import run

    project = make_project(tmp_path, n_rows=200)
    model = tiny_model_dir(project["model"], vocab_size=400)  # the tiny model, with the build's tokenizer:
    make_tokenizer(model)                                      # its files overwrite the word-level ones
    result = build(load_config("sql", project["configs"], {"build.num_proc": 1}), project["cache"],
                   log=lambda *a: None, progress=False)
    run_dir = run(make_config(model, tmp_path / "runs", max_steps=2, save_steps=1, **RUN_END), project["cache"])
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file() and result.build_id in (
        run_dir / "run.json").read_text()
    assert no_network == []
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_DATASETS_OFFLINE"] == "1"  # forced at import


def test_the_network_guard_has_teeth(no_network):
    with pytest.raises(NetworkUsed):
        socket.create_connection(("example.com", 443))
    with pytest.raises(NetworkUsed):
        socket.getaddrinfo("huggingface.co", 443)
    assert len(no_network) == 2


@pytest.mark.parametrize("trust", [None, False, True])
@pytest.mark.parametrize("weights", [True, False])
def test_trust_remote_code_is_what_the_config_says(tmp_path, monkeypatch, trust, weights):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from packtrain.trainer.model.model import choose_precision, load_base_model, model_source

    model_dir = tiny_model_dir(tmp_path / "model", weights=weights)  # before the spies: it calls from_config
    calls = []

    def spy(owner, name):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            calls.append((name, kwargs.get("trust_remote_code", "<not passed>")))
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapped)

    spy(AutoModelForCausalLM, "from_pretrained")
    spy(AutoModelForCausalLM, "from_config")
    spy(AutoConfig, "from_pretrained")
    config = make_config(model_dir, tmp_path / "runs")
    if trust is not None:
        data = config.to_dict()
        data["model"]["trust_remote_code"] = trust
        config = config_from_dict(data)
    load_base_model(config.model, model_source(config.model), choose_precision(config.train, torch.device("cpu")),
                    0, False, torch.device("cpu"))
    assert calls, "no transformers loader was called"
    assert {value for _, value in calls} == {bool(trust)}, calls
    assert ("from_config" in {name for name, _ in calls}) == (not weights)  # config only: random init


# ----------------------------------------------------------------------------------------------
# Only safe loaders


def unsafe_calls(source: str, filename: str = "<string>") -> list[str]:
    """Calls that can run code from a file: yaml.load/unsafe_load/full_load without a safe Loader,
    pickle/marshal/dill loads, torch.load without weights_only=True, numpy.load(allow_pickle=True),
    eval, exec."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = ast.unparse(func)
        keywords = {k.arg: k.value for k in node.keywords}
        where = f"{filename}:{node.lineno}: {ast.unparse(node)[:100]}"

        def is_true(key):
            return isinstance(keywords.get(key), ast.Constant) and keywords[key].value is True

        if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
            found.append(where)
        elif name in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
            found.append(where)
        elif name in ("yaml.load", "yaml.load_all"):
            loader = keywords.get("Loader") or (node.args[1] if len(node.args) > 1 else None)
            if loader is None or "Safe" not in ast.unparse(loader):
                found.append(where)
        elif name.split(".")[0] in ("pickle", "cPickle", "dill", "marshal", "cloudpickle") and \
                name.split(".")[-1] in ("load", "loads", "Unpickler"):
            found.append(where)
        elif name == "torch.load" and not is_true("weights_only"):
            found.append(where)
        elif name in ("np.load", "numpy.load") and is_true("allow_pickle"):
            found.append(where)
    return found


def source_files() -> list[Path]:
    return sorted(p for d in ("pipeline", "trainer") for p in (ROOT / d).rglob("*.py"))


def test_the_source_tree_uses_only_safe_loaders():
    files = source_files()
    assert len(files) > 20
    problems = [hit for path in files for hit in unsafe_calls(path.read_text(), str(path.relative_to(ROOT)))]
    assert problems == [], "unsafe loaders:\n" + "\n".join(problems)


@pytest.mark.parametrize("snippet", [
    "yaml.load(text)", "yaml.load(text, Loader=yaml.Loader)", "yaml.unsafe_load(text)", "pickle.load(f)",
    "pickle.loads(b)", "torch.load(path)", "torch.load(path, weights_only=False)", "np.load(p, allow_pickle=True)",
    "eval(expr)", "exec(code)",
])
def test_the_safe_loader_check_has_teeth(snippet):
    assert unsafe_calls(snippet), snippet
    assert not unsafe_calls("yaml.safe_load(text); yaml.load(text, Loader=yaml.SafeLoader); "
                            "torch.load(p, weights_only=True); np.load(p); json.loads(s)")


# ----------------------------------------------------------------------------------------------
# Names that become paths

BAD_NAMES = ["../x", "a/b", "", ".hidden", "x" * 100, "..", "/etc", "a\\b", "sql\n", "SQL"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_expert_names_cannot_escape(tmp_path, name, model_dir):
    from packtrain.trainer.run.train import run

    with pytest.raises(ContractError, match="invalid expert name"):
        check_expert_name(name)
    with pytest.raises(ContractError):
        expert_dir(tmp_path, name)
    with pytest.raises(ContractError):
        load_config(name, tmp_path)
    # a config made in code is refused when it is validated ...
    with pytest.raises(ConfigError, match="expert: invalid expert name"):
        make_config(model_dir, tmp_path / "runs", expert=name)
    # ... and one that skipped validation is refused where the name would become a path
    config = dataclasses.replace(make_config(model_dir, tmp_path / "runs"), expert=name)
    with pytest.raises(ContractError, match="invalid expert name"):
        build(config, tmp_path / "cache", log=lambda *a: None, progress=False)
    with pytest.raises(ConfigError, match="invalid expert name"):  # run() validates the config it is given
        run(config, tmp_path / "cache")
    assert list(tmp_path.iterdir()) == []  # nothing was created anywhere


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


BAD_RUN_NAMES = ["../x", "a/b", "", ".hidden", "x" * 200, "..", "/etc", "a\\b", "run\n"]


@pytest.mark.parametrize("name", BAD_RUN_NAMES)
def test_run_names_cannot_escape(name):
    with pytest.raises(ConfigError, match="run_name"):
        config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], "train": {"run_name": name}})


def test_good_names_are_accepted():
    for name in ("sql", "neo4j", "type-script_2", "x" * 64):
        assert check_expert_name(name) == name
    config = config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], "train": {"run_name": "v1.2_a-b"}})
    assert config.train.run_name == "v1.2_a-b"


def test_a_config_made_in_code_validates_the_expert_name():
    from packtrain.core.config import ConfigError
    from packtrain.core.configfile import config_from_dict

    with pytest.raises(ConfigError, match=r"expert: invalid expert name '\.\./x'"):
        config_from_dict({"expert": "../x", "sources": [{"name": "bundled"}]})
