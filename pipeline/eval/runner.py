"""The evaluation runner: an agent plays (pair, side, trial) episodes in worker processes.

Each worker process opens the benchmark once (:class:`pipeline.gym.env.Env` is expensive to open,
cheap to reset), builds the agent once, and plays the tasks it takes from a shared queue. The
parent alone writes: each finished episode is appended to ``journal.jsonl`` as it arrives (flushed
at once, fsynced at least every second), so a killed run loses only the episodes in flight and a rerun skips every finished
(pair, side, trial). At the end ``results.parquet`` and ``trajectories.jsonl`` (the gym's
trajectory format) are rewritten atomically from the journal, in task order.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import random
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.eval.agent import Agent, make_agent
from pipeline.files import AtomicFolder, sha256_file, stable_int
from pipeline.gym.database import Benchmark
from pipeline.gym.env import Env, env_version
from pipeline.gym.models import SIDES, TERMINAL, Limits
from pipeline.progress import episode_progress
from pipeline.staging import staged_database
from pipeline.workers import exit_with_parent

JOURNAL, RESULTS, TRAJECTORIES, RUN = "journal.jsonl", "results.parquet", "trajectories.jsonl", "run.json"
FSYNC_SECONDS = 1.0  # an fsync per episode costs ~6 ms here, more than a scripted episode

RESULT_SCHEMA = pa.schema([
    ("pair_id", pa.string()), ("side", pa.string()), ("trial", pa.int32()),
    ("success", pa.bool_()), ("reward", pa.float64()),
    ("termination", pa.string()),  # what ended the episode: answer | abstain | flag | step_limit
    ("behavior", pa.string()),  # the agent's final behaviour: answer | abstain | flag | none
    ("expected_behavior", pa.string()),
    ("answered", pa.bool_()),  # the agent committed to an answer (answer, or a flag carrying one)
    ("steps", pa.int32()),
    ("tool_calls", pa.string()),  # JSON object: calls per tool name ("invalid" for unparseable ones)
    ("tokens_in", pa.int64()), ("tokens_out", pa.int64()), ("seconds", pa.float64()),
    ("intent", pa.string()), ("level", pa.string()), ("noise_level", pa.string()), ("operator", pa.string()),
    ("split", pa.string()), ("agent", pa.string()), ("model", pa.string()),
])

Task = tuple[str, str, int]  # (pair_id, side, trial)


class EvalError(RuntimeError):
    """The run cannot start or go on (bad input, an output folder of another run, a failing agent)."""


@dataclass(frozen=True)
class EvalConfig:
    """What to run. ``options`` go to ``make_agent(agent, **options)``; together with the agent,
    the benchmark's content and the seed they identify a run, so a rerun into the same folder
    resumes it (``base_url`` is left out: it says where a model is served, not which).
    ``split``, ``sides``, ``trials`` and ``limit`` only choose tasks: a rerun may add more. ``limits``
    are the gym's per-episode limits (a small model needs fewer steps and shorter tool output)."""

    benchmark: Path
    agent: str
    options: dict = field(default_factory=dict)
    trials: int = 1
    workers: int = 1
    split: str | None = None
    sides: tuple[str, ...] = SIDES
    limit: int | None = None
    seed: int = 0
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class RunSummary:
    total: int  # tasks planned by this invocation
    skipped: int  # of those, finished by an earlier run
    played: int  # episodes played now
    succeeded: int  # of those, right
    seconds: float  # wall time of this invocation
    open_seconds: float  # until the last worker was ready: process start, imports, benchmark open, agent
    results: Path


# ---------------------------------------------------------------------------- tasks
def select_pairs(pair_ids: Iterable[str], limit: int | None, seed: int) -> list[str]:
    """Sorted pair ids; with ``limit``, the first ``limit`` of a seeded shuffle (then sorted)."""
    ids = sorted(pair_ids)
    if limit is not None:
        random.Random(seed).shuffle(ids)
        ids = sorted(ids[:limit])
    return ids


def plan(pair_ids: list[str], sides: Iterable[str], trials: int) -> list[Task]:
    """Tasks in the run's order: pair, then side, then trial."""
    return [(p, s, t) for p in sorted(pair_ids) for s in sorted(sides) for t in range(trials)]


def episode_rng(seed: int, task: Task) -> random.Random:
    return random.Random(stable_int(seed, *task))


def _benchmark_pairs(config: EvalConfig) -> list[str]:
    path = config.benchmark / "pairs.parquet"
    if not path.is_file():
        raise EvalError(f"--benchmark {config.benchmark}: no pairs.parquet (not a built benchmark folder)")
    table = pq.read_table(path, columns=["pair_id", "split"])
    rows = [p for p, s in zip(table["pair_id"].to_pylist(), table["split"].to_pylist())
            if config.split is None or s == config.split]
    if not rows:
        raise EvalError(f"--split {config.split}: {path} has no pair in that split")
    return rows


# ---------------------------------------------------------------------------- one episode
def play_episode(env: Env, agent: Agent, task: Task, rows: dict[str, dict] | None, seed: int) -> dict:
    """Reset, let the agent play, and return ``{"result": row, "trajectory": record}``."""
    pair_id, side, trial = task
    started = time.perf_counter()
    start = env.reset(pair_id, side)
    usage = agent.play(env, start, rows[pair_id] if rows is not None else None, episode_rng(seed, task))
    seconds = time.perf_counter() - started
    state, verdict = env.state, env.verdict
    if not state.done or verdict is None:
        raise EvalError(f"agent {agent.name} returned before the episode of {pair_id} ({side}) ended")
    trajectory = env.trajectory(trial)
    trajectory["metadata"].update(agent=agent.name, model=agent.model, tokens_in=usage.tokens_in,
                                  tokens_out=usage.tokens_out)
    calls = Counter(call["function"]["name"] for m in env.messages for call in m.get("tool_calls") or ())
    pair = env.benchmark.pair(pair_id)
    termination = state.termination or "none"
    given = verdict["given"]
    result = {
        "pair_id": pair_id, "side": side, "trial": trial, "success": bool(verdict["correct"]),
        "reward": state.reward, "termination": termination,
        "behavior": termination if termination in TERMINAL else "none",
        "expected_behavior": verdict["expected_behavior"],
        "answered": termination == "answer" or (termination == "flag" and given.get("answer") is not None),
        "steps": state.step_count, "tool_calls": json.dumps(dict(sorted(calls.items()))),
        "tokens_in": usage.tokens_in, "tokens_out": usage.tokens_out, "seconds": round(seconds, 6),
        "intent": pair.intent, "level": pair.level, "noise_level": pair.noise_level, "operator": pair.operator,
        "split": pair.split, "agent": agent.name, "model": agent.model,
    }
    return {"result": result, "trajectory": trajectory}


def _worker(parent: int, config: EvalConfig, staged_file: Path, tasks: mp.Queue, out: mp.Queue) -> None:
    exit_with_parent(parent)  # a worker must not outlive a killed runner
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        Benchmark.open(config.benchmark, config.limits.sql_memory_mb, staged_file)  # the Env's, over the shared base
        agent = make_agent(config.agent, **config.options)
        rows = None
        if agent.uses_labels:
            rows = {r["pair_id"]: r for r in pq.read_table(config.benchmark / "pairs.parquet").to_pylist()}
        with Env(config.benchmark, config.limits) as env:
            out.put(("ready", None))
            while (task := tasks.get()) is not None:
                record = play_episode(env, agent, task, rows, config.seed)
                line = json.dumps(record, ensure_ascii=False, default=str) + "\n"  # serialised here, in parallel
                out.put(("episode", (record["result"], line.encode())))
    except BaseException as exc:  # everything goes back to the parent, which stops the run
        out.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    out.put(("done", None))


# ---------------------------------------------------------------------------- journal and outputs
@dataclass(frozen=True)
class Entry:
    """One finished episode in the journal: its result row, and where its line is."""

    result: dict
    offset: int
    length: int

    @property
    def key(self) -> Task:
        return (self.result["pair_id"], self.result["side"], self.result["trial"])


def read_journal(path: Path) -> list[Entry]:
    """Finished episodes; a last line cut short by a kill is dropped (and cut from the file)."""
    if not path.is_file():
        return []
    entries, offset = [], 0
    with path.open("r+b") as f:
        for line in f:
            if not line.endswith(b"\n"):
                f.truncate(offset)
                break
            entries.append(Entry(json.loads(line)["result"], offset, len(line)))
            offset += len(line)
    return entries


def write_outputs(out: Path, journal: Path, entries: list[Entry]) -> None:
    """``results.parquet`` and ``trajectories.jsonl`` from the journal, in task order, atomically
    (trajectories are read back line by line: a long run's never sit in memory all at once)."""
    entries = sorted({e.key: e for e in reversed(entries)}.values(), key=lambda e: e.key)
    folder = AtomicFolder(out)
    try:
        folder.write_parquet(RESULTS, pa.Table.from_pylist([e.result for e in entries], schema=RESULT_SCHEMA))
        with journal.open("rb") as source, folder.path(TRAJECTORIES).open("w", encoding="utf-8") as sink:
            for e in entries:
                source.seek(e.offset)
                trajectory = json.loads(source.read(e.length))["trajectory"]
                sink.write(json.dumps(trajectory, ensure_ascii=False) + "\n")
        folder.commit()
    finally:
        folder.abort()


def run_identity(config: EvalConfig) -> dict:
    """What a rerun must share with the run whose folder it resumes."""
    return {"benchmark_sha256": {name: sha256_file(config.benchmark / name)
                                 for name in ("pairs.parquet", "overlays.parquet")},
            "agent": config.agent, "options": {k: v for k, v in config.options.items() if k != "base_url"},
            "seed": config.seed, "limits": config.limits.model_dump(), "env_version": env_version()}


def _claim(out: Path, config: EvalConfig) -> None:
    """Record the run's identity in ``run.json``, or refuse a folder that holds another run."""
    identity = run_identity(config)
    path = out / RUN
    if path.is_file():
        previous = json.loads(path.read_text())
        differs = [k for k in identity if previous.get(k) != identity[k]]
        if differs:
            raise EvalError(f"--out {out} holds results of another run ({', '.join(differs)} differ); "
                            "choose another folder or delete it")
        return
    folder = AtomicFolder(out)
    folder.write_text(RUN, json.dumps({**identity, "benchmark": str(config.benchmark)}, indent=1, default=str))
    folder.commit()


# ---------------------------------------------------------------------------- the run
def check_agent(config: EvalConfig) -> Agent:
    """Build the agent once here, so a bad name or option fails before any worker starts."""
    try:
        return make_agent(config.agent, **config.options)
    except TypeError as exc:
        raise EvalError(f"agent {config.agent!r} does not take the options "
                        f"{', '.join(config.options) or '(none)'}: {exc}") from None
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def run_eval(config: EvalConfig, out: str | os.PathLike, log: Callable[[str], None] | None = None) -> RunSummary:
    """Play every unfinished task of ``config`` into ``out``; ``log`` receives progress lines."""
    started = time.perf_counter()
    out = Path(out)
    config = replace(config, benchmark=Path(config.benchmark).resolve())
    if config.trials < 1 or config.workers < 1:
        raise EvalError("--trials and --workers must be at least 1")
    if bad := [s for s in config.sides if s not in SIDES]:
        raise EvalError(f"--side {bad[0]!r} is not one of {', '.join(SIDES)}")
    tasks = plan(select_pairs(_benchmark_pairs(config), config.limit, config.seed), config.sides, config.trials)
    check_agent(config)
    out.mkdir(parents=True, exist_ok=True)
    _claim(out, config)
    journal = out / JOURNAL
    entries = read_journal(journal)
    finished = {e.key for e in entries}
    pending = [t for t in tasks if t not in finished]
    if log and len(pending) < len(tasks):
        log(f"resuming: {len(tasks) - len(pending):,} of {len(tasks):,} episodes already in {journal}")
    played, succeeded, open_seconds = 0, 0, 0.0
    if pending:
        progress = episode_progress(log, len(pending)) if log else None
        synced = time.perf_counter()
        with journal.open("ab") as sink:
            for episode, opened in _play(config, pending):
                open_seconds = max(open_seconds, opened)
                if episode is None:
                    continue
                result, line = episode
                entries.append(Entry(result, sink.tell(), len(line)))
                sink.write(line)
                sink.flush()  # a killed runner loses nothing written: the kernel holds it
                if time.perf_counter() - synced > FSYNC_SECONDS:  # a crashed machine loses at most this
                    os.fsync(sink.fileno())
                    synced = time.perf_counter()
                played += 1
                succeeded += result["success"]
                if progress:
                    progress(played, succeeded)
            os.fsync(sink.fileno())
    write_outputs(out, journal, entries)
    return RunSummary(total=len(tasks), skipped=len(tasks) - len(pending), played=played, succeeded=succeeded,
                      seconds=time.perf_counter() - started, open_seconds=open_seconds, results=out / RESULTS)


def _play(config: EvalConfig, pending: list[Task]):
    """Yield ``((result, journal line), 0)`` as workers finish episodes, and ``(None, seconds)``
    when a worker is ready (started, benchmark open, agent built); stop every worker and raise
    :class:`EvalError` when one fails."""
    context = mp.get_context("spawn")  # workers import fresh: no forked DuckDB or thread state
    tasks, out = context.Queue(), context.Queue()
    n = min(config.workers, len(pending))
    for task in pending:
        tasks.put(task)
    for _ in range(n):
        tasks.put(None)
    # one on-disk copy of the staged base, written once, attached read-only by every worker
    with staged_database(config.benchmark / "staged") as staged_file:
        workers = [context.Process(target=_worker, args=(os.getpid(), config, staged_file, tasks, out), daemon=True)
                   for _ in range(n)]
        spawned = time.perf_counter()
        for w in workers:
            w.start()
        try:
            done = 0
            while done < n:
                try:
                    kind, payload = out.get(timeout=1.0)
                except queue.Empty:
                    if dead := [w for w in workers if not w.is_alive() and w.exitcode != 0]:
                        raise EvalError(f"an evaluation worker died (exit code {dead[0].exitcode})") from None
                    continue
                if kind == "error":
                    raise EvalError(f"agent {config.agent} failed in a worker: {payload.strip()}")
                if kind == "ready":
                    yield None, time.perf_counter() - spawned
                elif kind == "episode":
                    yield payload, 0.0
                else:
                    done += 1
        finally:
            for w in workers:
                if w.is_alive():
                    w.terminate()
            for w in workers:
                w.join()
            tasks.cancel_join_thread()
