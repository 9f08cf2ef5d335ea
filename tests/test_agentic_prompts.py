"""The hand-written agentic workload (benchmarks/prompts_agentic_eval.jsonl, described in its .md):
enough tasks, unique ids, every category represented, well-formed chat messages ending on a user
turn, and no user turn taken from the drafter's training or dev prompts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT / "benchmarks" / "prompts_agentic_eval.jsonl"
DATA = ROOT / "pydflash2" / "data"
CATEGORIES = {"edit", "bugfix", "docstrings", "convert", "extract", "quote", "continue", "tool_loop"}
ROLES = {"system", "user", "assistant", "tool"}


def _tasks() -> list[dict]:
    lines = EVAL.read_text(encoding="utf-8").splitlines()
    assert all(line.strip() for line in lines), "blank line in the JSONL"
    return [json.loads(line) for line in lines]


def test_tasks_ids_and_categories() -> None:
    tasks = _tasks()
    assert len(tasks) >= 60
    ids = [t["id"] for t in tasks]
    assert len(ids) == len(set(ids))
    for t in tasks:
        assert set(t) == {"id", "category", "messages"}
        assert t["category"] in CATEGORIES
        assert t["id"].startswith(t["category"] + "-")
    counts = Counter(t["category"] for t in tasks)
    assert set(counts) == CATEGORIES
    assert min(counts.values()) >= 6, counts


def test_messages_well_formed() -> None:
    for t in _tasks():
        messages = t["messages"]
        assert messages, t["id"]
        assert messages[-1]["role"] == "user", t["id"]
        for m in messages:
            assert set(m) == {"role", "content"}, t["id"]
            assert m["role"] in ROLES, t["id"]
            assert isinstance(m["content"], str) and m["content"].strip(), t["id"]
        if t["category"] == "tool_loop":
            assert any(m["content"].startswith("<tool_call>") for m in messages if m["role"] == "assistant")
            assert any(m["content"].startswith("Tool result (") for m in messages if m["role"] == "user")


def test_no_user_turn_from_training_prompts() -> None:
    seen = set()
    for name in ("prompts_train.txt", "prompts_dev.txt"):
        seen |= {line.strip() for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()}
    for t in _tasks():
        for m in t["messages"]:
            if m["role"] == "user":
                assert m["content"].strip() not in seen, t["id"]
                long_lines = [line.strip() for line in m["content"].splitlines() if len(line.strip()) > 40]
                assert not seen.intersection(long_lines), t["id"]
