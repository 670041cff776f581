"""The code's shape (issue 24): the trainer's one micro-step, and functions a reader can hold in their head.

- trainer/step.py's ``forward_loss`` is the one micro-step: the training loop, the evaluation and the
  micro-batch search call it, and none of them runs the forward or the autocast itself;
- trainer/loss.py computes losses from hidden states or logits and never calls the model;
- no function in trainer/ is over 80 lines or takes over 8 parameters (transformers' attention
  signature, ``varlen_attention_forward``, is theirs), nor in pipeline/ and packtrain/ outside click
  commands (whose parameters are their options).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer"
MAX_LINES, MAX_PARAMS = 80, 8
EXEMPT = {"varlen_attention_forward"}  # the signature transformers calls attention functions with


def names_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names})


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
            params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
            yield node.name, node.end_lineno - node.lineno + 1, len(params), node.lineno


def click_command(path: Path, name: str) -> bool:
    """Whether the function ``name`` in ``path`` is a click command (a decorator of click's or a group's)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return any("click." in ast.unparse(d) or ".command" in ast.unparse(d) for d in node.decorator_list)
    return False


@pytest.mark.parametrize("module", ["loop.py", "eval/evaluate.py", "model/microbatch.py"])
def test_the_loop_the_evaluation_and_the_search_share_one_micro_step(module):
    names = names_in(TRAINER / module)
    assert "forward_loss" in names
    assert not names & {"to_device", "packed_loss_sum", "packed_forward", "packed_hidden_states", "autocast"}


def test_the_loss_module_never_calls_the_model():
    assert not names_in(TRAINER / "loss.py") & {"packed_forward", "packed_hidden_states", "to_device"}


def test_no_trainer_function_is_over_80_lines_or_8_parameters():
    too_big = [f"trainer/{path.relative_to(TRAINER)}:{line} {name}: {lines} lines, {params} parameters"
               for path in sorted(TRAINER.rglob("*.py")) for name, lines, params, line in functions(path)
               if name not in EXEMPT and (lines > MAX_LINES or params > MAX_PARAMS)]
    assert too_big == []


@pytest.mark.parametrize("package", ["pipeline", "packtrain"])
def test_no_function_of_the_build_or_the_cli_is_over_80_lines_or_8_parameters(package):
    too_big = [f"{path.relative_to(ROOT)}:{line} {name}: {lines} lines, {params} parameters"
               for path in sorted((ROOT / package).rglob("*.py")) for name, lines, params, line in functions(path)
               if (lines > MAX_LINES or params > MAX_PARAMS) and not click_command(path, name)]
    assert too_big == []
