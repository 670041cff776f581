"""packtrain's one YAML reader: ``configs/<expert>.yaml`` and the defaults, ``--set`` values and the
YAML header of a dataset's README.md all go through :func:`load_yaml` (tests/test_bounded_inputs.py
checks that no other module calls a YAML loader).

It is ``yaml.safe_load`` (plain data: no ``!!python`` tag) with one more check, made on the composed
node graph before any Python value is built: aliases (``&name`` ... ``*name``) may add at most
:data:`MAX_ALIAS_NODES` nodes to the document once expanded, no node may hold itself, and nothing is
nested deeper than :data:`MAX_DEPTH` (deeper, PyYAML's composer and every reader that walks the
values recursively stop with a RecursionError). A "billion
laughs" document (ten anchors, each a list of ten aliases of the one before) is a few hundred bytes
whose expansion is 10**9 nodes: every reader that walks it (the config's checks, the build id's
hash, an error message quoting it) took minutes and gigabytes (issue 46: 132 s and 1.6 GB for a
dataset README, 64 s and 1.5 GB for a config). Now it is refused at once::

    >>> load_yaml("a: &x [1, 2]\\nb: *x")
    {'a': [1, 2], 'b': [1, 2]}
    >>> bomb = "a: &a [x, x]\\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}]\\n"
    ...                                  for i in range(20))
    >>> load_yaml(bomb)
    Traceback (most recent call last):
    ...
    packtrain.core.yaml_reader.YamlExpansionError: its aliases (&name, *name) expand 45 nodes to 8,388,605 (more than 10,000 added); write the values out instead of aliasing them
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_ALIAS_NODES = 10_000
"""The most nodes the aliases of one YAML document may add once expanded: far above what a config's
or a dataset card's ``<<: *defaults`` adds, far below what makes a reader slow."""


MAX_DEPTH = 100
"""The deepest nesting of lists and mappings read: far beyond any config or dataset card."""


class YamlExpansionError(yaml.YAMLError):
    """A document whose aliases expand it past :data:`MAX_ALIAS_NODES`, or hold themselves, or that is
    nested deeper than :data:`MAX_DEPTH`."""


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that checks each composed document (:func:`check_expansion`) before any
    value is constructed from it."""

    max_alias_nodes = MAX_ALIAS_NODES

    def compose_document(self) -> Node:
        node = super().compose_document()
        check_expansion(node, self.max_alias_nodes)
        return node


def load_yaml(text: str) -> Any:
    """The YAML document ``text`` as plain Python values (``yaml.safe_load``'s), its aliases bounded.
    Raises a ``yaml.YAMLError`` (:class:`YamlExpansionError` for the bounds); the caller names the file."""
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # a SafeLoader: no tag runs code
    except RecursionError:  # the composer recurses per level: nested far deeper than MAX_DEPTH
        raise YamlExpansionError(f"it is nested deeper than {MAX_DEPTH} levels of lists and mappings; flatten it") \
            from None


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return node.value
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expansion(root: Node, max_added: int = MAX_ALIAS_NODES) -> None:
    """Raise :class:`YamlExpansionError` where the graph under ``root`` (a node reached through an
    alias is the same object each time) holds a node that contains itself, counts more than
    ``max_added`` nodes more as a tree (every alias written out) than as a graph, or is nested deeper
    than :data:`MAX_DEPTH` as a tree (aliases of aliases can deepen it as they grow it). Linear in the
    graph's size, whatever the tree's."""
    size: dict[int, int] = {}  # id(node) -> the node's size as a tree
    open_: set[int] = set()  # the nodes whose subtree is being counted: the path from the root
    height: dict[int, int] = {}  # id(node) -> the levels of lists and mappings in it, aliases expanded
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        key = id(node)
        if counted:
            children = _children(node)
            size[key] = 1 + sum(size[id(child)] for child in children)
            height[key] = isinstance(node, (SequenceNode, MappingNode)) + max((height[id(c)] for c in children), default=0)
            if height[key] > MAX_DEPTH:
                raise YamlExpansionError(f"it is nested deeper than {MAX_DEPTH} levels of lists and mappings (line "
                                         f"{node.start_mark.line + 1}); flatten it")
            open_.discard(key)
            continue
        if key in size:
            continue
        open_.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_:
                raise YamlExpansionError(f"the node anchored at line {child.start_mark.line + 1} holds an alias "
                                         "(*name) of itself, so it never ends; write the value out instead")
            if id(child) not in size:
                stack.append((child, False))
    written, expanded = len(size), size[id(root)]
    if expanded - written > max_added:
        raise YamlExpansionError(f"its aliases (&name, *name) expand {written:,} nodes to {expanded:,} (more than "
                                 f"{max_added:,} added); write the values out instead of aliasing them")
