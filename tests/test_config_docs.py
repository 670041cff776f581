"""Every field of every config dataclass has a docstring: a string literal right under the field,
saying what it does, its unit and when to change it (STYLE.md: "fields documented")."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

from packtrain.core.config import ExpertConfig


def config_classes(root: type = ExpertConfig) -> dict[str, type]:
    """``root`` and every dataclass its fields hold (in lists, unions, ...), by name."""
    found: dict[str, type] = {}
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for hint in typing.get_type_hints(cls).values():
            stack = [hint]
            while stack:
                t = stack.pop()
                if dataclasses.is_dataclass(t):
                    todo.append(t)
                stack.extend(typing.get_args(t))
    return found


def undocumented_fields(source: str) -> list[str]:
    """The fields (``Class.field``) of the classes in ``source`` with no string literal right under them."""
    missing = []
    for cls in ast.walk(ast.parse(textwrap.dedent(source))):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node, after in zip(cls.body, cls.body[1:] + [None]):
            if isinstance(node, ast.AnnAssign):
                documented = (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                              and isinstance(after.value.value, str) and after.value.value.strip() != "")
                if not documented:
                    missing.append(f"{cls.name}.{node.target.id}")
    return missing


def test_the_check_finds_a_field_without_a_docstring():
    source = '''
    class A:
        """A class."""

        x: int = 1
        """The x."""
        y: int = 2
        z: int = 3
        """The z."""
    '''
    assert undocumented_fields(source) == ["A.y"]


def test_every_config_class_is_found():
    assert sorted(config_classes()) == ["BuildConfig", "CpuConfig", "ExpertConfig", "FormatConfig", "LoraConfig",
                                        "ModelConfig", "PackConfig", "RowCondition", "SourceConfig", "StageConfig",
                                        "TrainConfig"]


def test_every_field_of_every_config_class_has_a_docstring():
    missing = [name for cls in config_classes().values() for name in undocumented_fields(inspect.getsource(cls))]
    assert missing == []


def test_every_docstring_field_is_a_real_field():
    # the walk above reads the dataclass fields; make sure the source it parses is the same class
    for cls in config_classes().values():
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        annotated = [n.target.id for n in tree.body[0].body if isinstance(n, ast.AnnAssign)]
        assert annotated == [f.name for f in dataclasses.fields(cls)]
