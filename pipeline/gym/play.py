"""A person plays one episode at a prompt: the same Env and tools an agent gets.

Commands (one per line; ``python`` reads code until a line holding only ``.``):

    sql SELECT ...                      run one query
    python                              then code lines, then a line with "."
    answer VALUE                        final answer (JSON array for a list or set)
    abstain REASON                      the data cannot support an answer
    flag CATEGORY | EVIDENCE [| ANSWER] a data problem, and the answer the data still support
    schema | help | quit
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pipeline.gym.env import Env

HELP = __doc__.split("\n\n", 1)[1].rstrip()


def parse_command(line: str, read_more: Callable[[], str | None]) -> dict | str | None:
    """A tool call for ``line``, a word for the loop (schema/help/quit), or None for an empty line."""
    word, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    if not word:
        return None
    if word in ("schema", "help", "quit"):
        return word
    if word == "sql":
        return {"name": "sql", "arguments": {"query": rest}}
    if word == "python":
        lines = [rest] if rest else []
        while (more := read_more()) is not None and more.strip() != ".":
            lines.append(more)
        return {"name": "python", "arguments": {"code": "\n".join(lines)}}
    if word == "answer":
        return {"name": "answer", "arguments": {"value": _value(rest)}}
    if word == "abstain":
        return {"name": "abstain", "arguments": {"reason": rest}}
    if word == "flag":
        parts = [p.strip() for p in rest.split("|")]
        arguments = {"category": parts[0], "evidence": parts[1] if len(parts) > 1 else ""}
        if len(parts) > 2 and parts[2]:
            arguments["answer"] = _value(parts[2])
        return {"name": "flag", "arguments": arguments}
    return "help"


def _value(text: str):
    """A JSON array stays a list; anything else is the text as typed."""
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def play(env: Env, pair_id: str, side: str, read: Callable[[str], str | None], write: Callable[[str], None]) -> dict:
    """Run one episode with ``read(prompt)`` for input and ``write`` for output; returns the verdict."""
    start = env.reset(pair_id, side)
    write(f"Question ({side} side of pair {pair_id}):\n{start.question}\n\nType 'help' for commands, "
          "'schema' for the tables.")
    while True:
        line = read("gym> ")
        if line is None:
            line = "quit"
        command = parse_command(line, lambda: read("... "))
        if command is None:
            continue
        if command == "quit":
            write("Episode abandoned: no verdict.")
            return {}
        if command in ("help", "schema"):
            write(HELP if command == "help" else env.schema_text)
            continue
        obs = env.step(command)
        write(obs.content)
        if obs.done:
            info = obs.info
            write(f"\nVerdict: {'RIGHT' if info['correct'] else 'WRONG'} (reward {obs.reward:g}) — {info['reason']}\n"
                  f"expected: {info['expected_behavior']}"
                  + (f" {info['expected_answer']}" if info["expected_answer"] is not None else "")
                  + (f" [category {info['expected_category']}]" if info["expected_category"] else ""))
            return info
