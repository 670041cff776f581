"""No test asserts wall time: speed is measured by benchmarks (docs/BENCHMARKS.md), and a bound on a
duration fails on a loaded machine whatever the code does. A test counts the work instead (the calls,
the parses, the kills), or waits for something that would take far longer than its hang guard.

The check reads every test file: an ``assert`` whose condition holds an elapsed time (a clock reading
minus another, directly or through a name it was stored in) is one. A deadline that guards against a
hang (``deadline = time.monotonic() + 60``, then ``while time.monotonic() < deadline``) is not: it
bounds how long a broken test may hang, not how fast a working one is.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns", "process_time"}


def _is_clock(node: ast.AST) -> bool:
    """``time.monotonic()`` and its kin, or ``perf_counter()`` imported by name."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


def _mentions(node: ast.AST, names: set[str], clock: bool) -> bool:
    return any((clock and _is_clock(n)) or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(node))


def _targets(node: ast.AST) -> list[str]:
    """The names an assignment binds: ``a``, ``a, b``, and ``a`` of ``a[i]`` or ``a.x``."""
    out, todo = [], list(node.targets if isinstance(node, ast.Assign) else [node.target])
    while todo:
        target = todo.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            todo.extend(target.elts)
        elif isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
            todo.append(target.value)
        elif isinstance(target, ast.Name):
            out.append(target.id)
    return out


def timing_assertions(source: str) -> list[int]:
    """The lines of ``source``'s asserts whose condition holds an elapsed time, function by function."""
    lines = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = list(ast.walk(function))
        readings: set[str] = set()  # names holding a clock reading (started, deadline)
        elapsed: set[str] = set()  # names holding a difference of readings (took)
        for _ in range(3):  # names flow forward through a few assignments
            for node in body:
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    if _mentions(node.value, readings, clock=True):
                        readings.update(_targets(node))
                    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and _mentions(n, readings, True)
                           for n in ast.walk(node.value)) or _mentions(node.value, elapsed, clock=False):
                        elapsed.update(_targets(node))
        for node in body:
            if isinstance(node, ast.Assert) and (
                    _mentions(node.test, elapsed, clock=False)
                    or any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and _mentions(n, readings, True)
                           for n in ast.walk(node.test))):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_no_test_asserts_wall_time():
    found = [f"{path.name}:{line}" for path in sorted(TESTS.rglob("*.py"))
             for line in timing_assertions(path.read_text())]
    assert found == [], "these assert a duration: count the work instead, or move the figure to a benchmark"


def test_the_check_finds_each_shape_of_a_duration_bound():
    # the shapes, as a test file would hold them, in a text file (not a .py the check reads)
    source = (TESTS / "timing_assertion_shapes.txt").read_text()
    assert timing_assertions(source) == [7, 13, 18]
