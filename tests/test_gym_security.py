"""Attacks on the gym: each must fail with a readable error and leave the environment usable.

SQL attacks go through the ``sql`` tool; Python attacks through the ``python`` tool, whose worker
must really be sandboxed here (CI installs bubblewrap): a missing sandbox fails these tests
rather than letting them pass vacuously.
"""

from __future__ import annotations

import os
import socket

import pytest
from gym_benchmark import make_benchmark

from pipeline.gym.env import Env
from pipeline.gym.models import Limits
from pipeline.gym.sandbox import _python_roots


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return make_benchmark(tmp_path_factory.mktemp("gym_security"))


@pytest.fixture(scope="module")
def env(bench):
    limits = Limits(sql_seconds=1.0, python_seconds=4.0, python_memory_mb=1024, output_bytes=4_000)
    with Env(bench, limits) as e:
        yield e


@pytest.fixture()
def episode(env):
    """A fresh noise episode on a pair with an overlay; afterwards the env must still answer queries."""
    env.reset("p_count", "noise")
    yield env
    if not env.state.done:
        assert env.step({"name": "sql", "arguments": {"query": "SELECT count(*) FROM patients"}}).content \
            .split("\n")[1] == "29", "the environment is not usable after the attack"


def sql(env, query: str) -> str:
    return env.step({"name": "sql", "arguments": {"query": query}}).content


def python(env, code: str) -> str:
    return env.step({"name": "python", "arguments": {"code": code}}).content


def _pairs(bench) -> str:
    return str(bench / "pairs.parquet")


SQL_ATTACKS = {
    "table function read_csv": ("SELECT * FROM read_csv('/etc/passwd')", "table functions are not allowed"),
    "table function read_text": ("SELECT * FROM read_text('/etc/passwd')", "table functions are not allowed"),
    "sniff_csv": ("SELECT * FROM sniff_csv('/etc/passwd')", "table functions are not allowed"),
    "string-literal table": ("SELECT * FROM '/etc/passwd'", "string literals cannot be used as tables"),
    "string-literal benchmark parquet": ("SELECT * FROM '{pairs}'", "string literals cannot be used as tables"),
    "read_parquet benchmark": ("SELECT * FROM read_parquet('{pairs}')", "table functions are not allowed"),
    "read_parquet in a scalar subquery": ("SELECT (SELECT count(*) FROM read_parquet('{pairs}'))",
                                          "table functions are not allowed"),
    "string-literal table named like a MIMIC table": ("SELECT * FROM 'patients'", "string literals"),
    "glob": ("SELECT * FROM glob('/*')", "table functions are not allowed"),
    "attach": ("ATTACH '/tmp/evil.db' AS evil", "only SELECT/WITH queries are allowed"),
    "copy": ("COPY patients TO '/tmp/leak.csv'", "only SELECT/WITH queries are allowed"),
    "export": ("EXPORT DATABASE '/tmp/leak'", "could not parse"),
    "install": ("INSTALL httpfs", "only SELECT/WITH queries are allowed"),
    "load": ("LOAD httpfs", "only SELECT/WITH queries are allowed"),
    "set": ("SET enable_external_access = true", "only SELECT/WITH queries are allowed"),
    "set variable": ("SET VARIABLE overlay_id = -1", "only SELECT/WITH queries are allowed"),
    "reset": ("RESET search_path", "only SELECT/WITH queries are allowed"),
    "pragma": ("PRAGMA database_list", "only SELECT/WITH queries are allowed"),
    "call": ("CALL duckdb_settings()", "only SELECT/WITH queries are allowed"),
    "create table": ("CREATE TABLE evil AS SELECT * FROM patients", "only SELECT/WITH queries are allowed"),
    "drop view": ("DROP VIEW patients", "only SELECT/WITH queries are allowed"),
    "insert": ("INSERT INTO patients (subject_id) VALUES (1)", "only SELECT/WITH queries are allowed"),
    "update": ("UPDATE patients SET gender = 'X'", "only SELECT/WITH queries are allowed"),
    "delete": ("DELETE FROM patients", "only SELECT/WITH queries are allowed"),
    "two statements": ("SELECT 1; DROP VIEW patients", "exactly one statement is allowed; got 2"),
    "describe": ("DESCRIBE patients", "only SELECT/WITH queries are allowed"),
    "show tables": ("SHOW TABLES", "only SELECT/WITH queries are allowed"),
    "duckdb_settings": ("SELECT * FROM duckdb_settings()", "table functions are not allowed"),
    "duckdb_views": ("SELECT sql FROM duckdb_views()", "table functions are not allowed"),
    "current_setting": ("SELECT current_setting('enable_external_access')", "function current_setting()"),
    "information_schema": ("SELECT * FROM information_schema.tables", "use plain table names"),
    "query() string execution": ("SELECT * FROM query('SELECT * FROM base.patients')",
                                 "table functions are not allowed"),
    "query_table": ("SELECT * FROM query_table('patients')", "table functions are not allowed"),
    "base schema": ("SELECT count(*) FROM base.patients", "use plain table names"),
    "main schema overlay view": ("SELECT * FROM main.patients", "use plain table names"),
    "catalog-qualified": ("SELECT * FROM memory.base.patients", "use plain table names"),
    "patch tables": ("SELECT * FROM patch.patients_removed", "use plain table names"),
    "session variable": ("SELECT getvariable('overlay_id')", "function getvariable() is not allowed"),
    "environment variable": ("SELECT getenv('HOME')", "function getenv() is not allowed"),
    "_rid column": ("SELECT _rid FROM patients", "_rid is internal"),
    "_rid in a filter": ("SELECT count(*) FROM patients WHERE \"_RID\" > 0", "_rid is internal"),
    "unknown table": ("SELECT * FROM pairs", "unknown table 'pairs'"),
    "version": ("SELECT version()", "is not allowed"),
    "cartesian explosion": ("SELECT count(*) FROM labevents a, labevents b, labevents c",
                            "ran longer than the 1 s limit"),
    "endless recursive CTE": (("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                               "SELECT count(*) FROM r"), "query stopped"),
}


@pytest.mark.parametrize("name", list(SQL_ATTACKS))
def test_sql_attack_is_refused(episode, bench, name):
    query, message = SQL_ATTACKS[name]
    out = sql(episode, query.format(pairs=_pairs(bench)))
    assert out.startswith("error:") and message in out, out


def test_select_star_never_shows_rid_nor_deleted_rows(episode):
    out = sql(episode, "SELECT * FROM patients")
    assert "_rid" not in out.split("\n")[0]
    assert sql(episode, "SELECT count(*) FROM patients").split("\n")[1] == "29"
    assert "_rid" not in sql(episode, "SELECT patients FROM patients LIMIT 1")


# ---------------------------------------------------------------------------- python
@pytest.fixture(scope="module")
def sandboxed(env):
    """The sandbox must work on this machine (CI installs bubblewrap)."""
    env.reset("p_count", "noise")
    out = python(env, "print('sandbox up')")
    assert out == "sandbox up", out
    return env


@pytest.fixture()
def py(sandboxed):
    sandboxed.reset("p_count", "noise")
    yield sandboxed
    assert python(sandboxed, "print(sum(range(4)))") == "6", "python is not usable after the attack"


def test_python_cannot_read_the_benchmark_by_path(py, bench):
    out = python(py, f"open({_pairs(bench)!r}, 'rb').read()")
    assert "FileNotFoundError" in out
    out = python(py, f"open({str(bench / 'staged' / 'patients.parquet')!r}, 'rb').read()")
    assert "FileNotFoundError" in out


def test_python_cannot_find_the_benchmark_by_glob(py, bench):
    out = python(py, f"import glob, os\nprint(glob.glob({str(bench)!r} + '/**/*', recursive=True), "
                     f"glob.glob({str(bench.parent)!r} + '/*'), glob.glob('/*/*.parquet'), sorted(os.listdir('/')))")
    found_bench, found_parent, found_top, root = out.split("] ", 3)
    assert found_bench == found_parent == found_top == "["
    # the Python installation is mounted at its own path, so its top folder (e.g. /work, /home) is visible
    python_tops = {root.parts[1] for root in _python_roots()}
    assert set(eval(root)) <= {"bin", "dev", "etc", "gym", "lib", "lib64", "proc", "scratch", "tmp", "usr"} | python_tops


def test_python_cannot_read_the_benchmark_through_duckdb(py, bench):
    out = python(py, f"import duckdb\nduckdb.sql(\"SELECT * FROM '{_pairs(bench)}'\").fetchall()")
    assert "IOException" in out or "No files found" in out or "does not exist" in out, out


@pytest.mark.parametrize("name", ["read_parquet benchmark", "attach", "session variable", "base schema",
                                  "_rid column", "two statements", "query() string execution"])
def test_python_sql_applies_the_same_guard(py, bench, name):
    query, message = SQL_ATTACKS[name]
    out = python(py, f"sql({query.format(pairs=_pairs(bench))!r})")
    assert "SqlError" in out and message in out, out


def test_python_sql_is_interrupted_by_the_time_limit(py):
    out = python(py, f"sql({SQL_ATTACKS['cartesian explosion'][0]!r})")
    assert "SqlError: query stopped" in out


def test_python_cannot_write_outside_scratch(py, bench):
    out = python(py, "import os\nfor p in ['/usr/evil', '/evil', '/gym/evil', " + repr(str(bench / "evil")) + "]:\n"
                     "    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
                     "    except OSError as e:\n        print(type(e).__name__)\n"
                     "open('/scratch/ok.txt', 'w').write('fine'); print(open('/scratch/ok.txt').read())")
    assert "WROTE" not in out and out.endswith("fine")
    assert not (bench / "evil").exists()


def test_python_scratch_files_are_capped(py):
    out = python(py, "f = open('/scratch/big', 'wb')\nf.write(b'x' * (100 * 2**20))")
    assert "File too large" in out or "No space left" in out, out


def test_python_has_no_network(py):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        out = python(py, f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))")
        assert "ConnectionRefusedError" in out, out
    finally:
        listener.close()


def test_python_fork_bomb_is_bounded(py):
    out = python(py, "import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in out or "Resource temporarily unavailable" in out or "stopped" in out, out


def test_python_huge_allocation_fails(py):
    out = python(py, "x = bytearray(50 * 2**30)")
    assert "MemoryError" in out


def test_python_endless_loop_is_killed_and_the_worker_restarts(py):
    python(py, "kept = 1")
    out = python(py, "while True:\n    pass")
    assert "ran longer than the 4 s limit" in out and "variables from earlier calls are gone" in out
    assert "NameError" in python(py, "kept")


def test_python_printing_a_gigabyte_is_capped(py):
    out = python(py, "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)")
    assert len(out.encode()) <= 4_000 + 200
    assert "more characters not shown" in out or "output cut at 4,000 bytes" in out or "stopped" in out


def test_python_cannot_read_the_parents_environment(py, monkeypatch):
    monkeypatch.setenv("GYM_TEST_SECRET", "hunter2")
    python(py, "raise SystemExit")  # any call; then a fresh worker inherits nothing either
    py.reset("p_count", "noise")
    out = python(py, "import os\nprint(sorted(os.environ))\nprint(open('/proc/1/environ','rb').read())")
    assert "hunter2" not in out and "GYM_TEST_SECRET" not in out


def test_python_cannot_signal_the_parent(py):
    out = python(py, f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)")
    assert "ProcessLookupError" in out or "PermissionError" in out
    out = python(py, "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGKILL)")
    assert "error" in out.lower() or "stopped" in out or out == "(no output; print() what you want to see)"


def test_python_segfault_restarts_the_worker(py):
    out = python(py, "import ctypes\nctypes.string_at(0)")
    assert "killed by signal SIGSEGV" in out and "restarted" in out


def test_python_unbounded_recursion(py):
    assert "RecursionError" in python(py, "def f(n):\n    return f(n + 1)\nf(0)")
    out = python(py, "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nf(0)")
    assert any(m in out for m in ("RecursionError", "MemoryError", "killed by signal", "ran longer than")), out


def test_python_cannot_see_host_processes(py):
    out = python(py, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert str(os.getpid()) not in out.strip("[]").split(", ")
