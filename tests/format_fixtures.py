"""Shared by the format tests (test_dataset_formats, test_chat_tools, test_chat_tool_templates): a
builder over one tokenizer and cache (its fixtures are in conftest.py), and the tool definitions and
references (``apply_chat_template`` with tools and kwargs) the tools tests compare with."""

from __future__ import annotations

import json
from pathlib import Path

from build_fixtures import packed_documents as documents, seed_decision, write_jsonl
from packtrain.core.configfile import config_from_dict
from packtrain.pipeline.orchestrate.build import build


def conversations(multi_turn: bool) -> list[list[dict]]:
    """Eight conversations, a system message in some; two exchanges each where ``multi_turn``."""
    out = []
    for i in range(8):
        turns = [{"role": "user", "content": f"How many rows in t{i}?"},
                 {"role": "assistant", "content": f"SELECT COUNT(*) FROM t{i}"}]
        if multi_turn:
            turns += [{"role": "user", "content": f"And with c > {i}?"},
                      {"role": "assistant", "content": f"SELECT COUNT(*) FROM t{i} WHERE c > {i}"}]
        out.append(([{"role": "system", "content": "You write SQL."}] if i % 3 == 0 else []) + turns)
    return out


def quiet(*_):
    pass


class Builder:
    """Builds configs over one tokenizer, in one cache (the encoder decision is made once)."""

    def __init__(self, root: Path, tokenizer: Path):
        self.root, self.tokenizer, self.n = root, tokenizer, 0
        seed_decision(root / "cache", tokenizer)

    def config(self, rows: list[dict] | Path, fmt: dict, source: dict | None = None, **build_settings):
        self.n += 1
        data = rows if isinstance(rows, Path) else write_jsonl(self.root / f"data-{self.n}" / "rows.jsonl", rows)
        return config_from_dict({
            "expert": "formats", "sources": [{"name": str(data), **(source or {})}], "format": fmt,
            "pack": {"block_size": 1024, "val_fraction": 0.0},
            "build": {"num_proc": 1, "dedup": "none", **build_settings}, "model": {"name": str(self.tokenizer)}})

    def build(self, rows, fmt: dict, source: dict | None = None, **build_settings):
        return build(self.config(rows, fmt, source, **build_settings), self.root / "cache", log=quiet, progress=False)


def shards(result) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))}


def report(result) -> dict:
    return json.loads((result.path / "report.json").read_text())


CHAT = {"style": "chat", "messages": "messages"}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def tool_rows() -> list[dict]:
    """Rows as TRL reads them: ``tools`` a list of JSON schemas, the same as JSON text, or null."""
    ask = lambda i: [{"role": "user", "content": f"Weather in city {i}?"}, {"role": "assistant", "content": f"Sunny {i}."}]
    return ([{"messages": ask(i), "tools": [WEATHER]} for i in range(3)] + [{"messages": ask(3), "tools": json.dumps([WEATHER])}]
            + [{"messages": ask(4), "tools": None}, {"messages": ask(5), "tools": "[]"}])


def expected_turns(tokenizer, chat: list[dict], tools, turns, **kwargs) -> list[tuple[list[int], list[int]]]:
    """apply_chat_template's ids of the conversation through each of ``turns`` (with ``tools`` and
    ``kwargs``), the mask from the end of its generation prompt through the turn's end-of-turn token."""
    out = []
    for k in turns:
        ids = list(tokenizer.apply_chat_template(chat[: k + 1], tools=tools, tokenize=True, return_dict=True,
                                                 **kwargs)["input_ids"])
        while tokenizer.decode(ids[-1:]).isspace():  # the newline after <|im_end|>, not trained on
            ids.pop()
        head = len(tokenizer.apply_chat_template(chat[:k], tools=tools, tokenize=True, add_generation_prompt=True,
                                                 return_dict=True, **kwargs)["input_ids"])
        out.append((ids, [0] * head + [1] * (len(ids) - head)))
    return out


SHORTCUTS_OFF = {"fast_encoder": False, "line_cache": False, "render_once": False}


SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}


def ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Weather in city {i}?"}, {"role": "assistant", "content": f"Sunny {i}."}]


def varied_rows() -> list[dict]:
    """Rows whose tools differ in keys (Arrow unifies them), none, or empty."""
    tools = [[WEATHER], [SEARCH], [WEATHER, SEARCH], None, []]
    return [{"messages": ask(i), "tools": t} for i, t in enumerate(tools)]


def reference(tokenizer, rows: list[dict], tools_key: str = "tools", **kwargs) -> list:
    """TRL's documents of ``rows`` (as ``datasets`` gives them): apply_chat_template with the row's tools."""
    def tools(row):
        value = row.get(tools_key)
        return json.loads(value) if isinstance(value, str) else value

    return sorted(doc for row in rows for doc in expected_turns(
        tokenizer, row["messages"], tools(row), [k for k, m in enumerate(row["messages"]) if m["role"] == "assistant"],
        **kwargs))


def check(builder: Builder, tokenizer, data, fmt: dict, expected_rows: list[dict], source: dict | None = None, **settings):
    """The build of ``data`` is the reference of ``expected_rows``, the same bytes with the shortcuts off."""
    result = builder.build(data, fmt, source, **settings)
    assert shards(result) == shards(builder.build(data, fmt, source, **settings, **SHORTCUTS_OFF))
    assert sorted(documents(result)) == reference(tokenizer, expected_rows)
    return result


def write_lines(path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


