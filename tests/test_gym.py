"""The gym: episodes, tools, scoring, trajectories, the TRL adapter and `play`, on a small real benchmark."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from gym_benchmark import make_benchmark

from pipeline.cli import main
from pipeline.gym.agents import AGENTS, result_values
from pipeline.gym.database import Benchmark
from pipeline.gym.env import Env, EpisodeError
from pipeline.gym.models import Answer, EpisodeState, Flag, Limits, Sql
from pipeline.gym.recorder import Recorder
from pipeline.gym.scoring import (
    NUMBER_ABS_TOL,
    Unparseable,
    judge,
    parse_boolean,
    parse_number,
    score_answer,
)
from pipeline.gym.trl import BENCHMARK_ENV_VAR, GymTRLEnvironment


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return make_benchmark(tmp_path_factory.mktemp("gym_bench"))


@pytest.fixture(scope="module")
def rows(bench):
    return {r["pair_id"]: r for r in pq.read_table(bench / "pairs.parquet").to_pylist()}


@pytest.fixture()
def env(bench):
    with Env(bench, Limits(max_steps=6, sql_rows=5, output_bytes=2_000)) as e:
        yield e


def sql(env, query: str) -> str:
    return env.step({"name": "sql", "arguments": {"query": query}}).content


# ---------------------------------------------------------------------------- episodes
def test_reset_gives_the_sides_question_schema_without_rid_and_tool_schemas(env, rows):
    clean = env.reset("p_count", "clean")
    assert clean.question == rows["p_count"]["clean_question"] and clean.question in clean.content
    noise = env.reset("p_count", "noise")
    assert noise.question == rows["p_count"]["noisy_question"]
    names = {t.name for t in noise.tables}
    assert {"patients", "labevents", "admissions"} <= names
    assert all(c.name != "_rid" for t in noise.tables for c in t.columns)
    assert "_rid" not in noise.content
    tools = {t["function"]["name"]: t["function"] for t in noise.tools}
    assert list(tools) == ["sql", "python", "answer", "abstain", "flag"]
    assert tools["sql"]["parameters"]["required"] == ["query"]
    assert tools["flag"]["parameters"]["required"] == ["category", "evidence"]
    assert "unit_error" in tools["flag"]["parameters"]["properties"]["category"]["enum"]
    json.dumps(noise.tools)


def test_every_prompt_shares_the_schema_as_a_prefix_and_ends_with_its_question(env, rows):
    first, second = env.reset("p_count", "clean").content, env.reset("p_maxlab", "noise").content
    assert first.endswith(rows["p_count"]["clean_question"]) and second.endswith(rows["p_maxlab"]["noisy_question"])
    shared = os.path.commonprefix([first, second])  # what a model server reads once and caches
    assert "Tables (DuckDB types)" in shared and "Problem categories" in shared
    assert len(shared) > len(first) - len(rows["p_count"]["clean_question"]) - 20


def test_reset_refuses_unknown_pair_and_side(env):
    with pytest.raises(KeyError, match="no pair 'nope'"):
        env.reset("nope", "noise")
    with pytest.raises(ValueError, match="side must be one of clean, noise"):
        env.reset("p_count", "dirty")


def test_each_episode_sees_its_own_overlay_and_switches_cleanly(env, rows):
    env.reset("p_count", "clean")
    clean = sql(env, "SELECT count(*) AS n FROM patients")
    env.reset("p_count", "noise")
    noisy = sql(env, "SELECT count(*) AS n FROM patients")
    assert clean.split("\n")[1] == "30" and noisy.split("\n")[1] == "29"
    env.reset("p_maxlab", "noise")  # another pair's overlay: patients untouched
    assert sql(env, "SELECT count(*) AS n FROM patients").split("\n")[1] == "30"
    value = sql(env, rows["p_maxlab"]["gold_sql"]).split("\n")[1]
    assert float(value) == pytest.approx(1000 * float(json.loads(rows["p_maxlab"]["clean_answer"])))


def test_two_envs_share_one_base_and_keep_their_own_overlays(bench, env):
    other = Env(bench)
    try:
        assert other.benchmark is env.benchmark
        env.reset("p_count", "noise")
        other.reset("p_count", "clean")
        assert sql(env, "SELECT count(*) FROM patients").split("\n")[1] == "29"
        assert sql(other, "SELECT count(*) FROM patients").split("\n")[1] == "30"
    finally:
        other.close()


def test_a_process_reads_the_base_from_a_staged_file_it_deletes_at_exit(bench):
    """No copy of the base in memory: the benchmark attaches a staged database read-only."""
    script = ("import os, sys; from pipeline.gym.database import Benchmark; "
              "b = Benchmark.open(sys.argv[1], 256); con = b.db.con; "
              "print(b.staged_file, os.path.exists(b.staged_file), "
              "con.sql(\"SELECT path FROM duckdb_databases() WHERE database_name = 'base'\").fetchall()[0][0], "
              "con.sql(\"SELECT count(*) FROM duckdb_tables() WHERE database_name = 'memory' "
              "AND schema_name = 'base'\").fetchall()[0][0])")
    found = subprocess.run([sys.executable, "-c", script, str(bench)], capture_output=True, text=True, check=True)
    staged, existed, attached, copies = found.stdout.split()
    assert (existed, attached, copies) == ("True", staged, "0")
    assert not Path(staged).exists()


def test_sql_output_is_capped_in_rows_and_bytes_with_counts(env):
    env.reset("p_count", "clean")
    out = sql(env, "SELECT subject_id FROM patients ORDER BY 1")
    lines = out.split("\n")
    assert lines[0] == "subject_id" and len(lines) == 1 + 5 + 1
    assert lines[-1] == "(30 rows; showing the first 5)"
    wide = sql(env, "SELECT repeat('x', 1500) AS a, repeat('y', 1500) AS b FROM patients")
    assert len(wide.encode()) <= 2_100 and "output cut at 2,000 bytes" in wide
    assert sql(env, "SELECT NULL AS a, true AS b").split("\n")[1] == "NULL | true"


def test_sql_errors_come_back_as_text(env):
    env.reset("p_count", "clean")
    out = sql(env, "SELECT no_such_column FROM patients")
    assert out.startswith("error:") and "no_such_column" in out and "clean." not in out and "noisy_" not in out
    obs = env.step({"name": "sql", "arguments": {"query": "SELEC 1"}})
    assert obs.content.startswith("error:") and not obs.done


def test_openai_shapes_and_typed_actions_are_accepted(env):
    env.reset("p_count", "clean")
    assert "30" in env.step({"name": "sql", "arguments": '{"query": "SELECT count(*) FROM patients"}'}).content
    assert "30" in env.step({"id": "x", "type": "function", "function": {
        "name": "sql", "arguments": json.dumps({"query": "SELECT count(*) FROM patients"})}}).content
    assert "30" in env.step(Sql(query="SELECT count(*) FROM patients")).content
    env.reset("p_count", "clean")
    assert env.step({"name": "rm", "arguments": {}}).content.startswith("error: unknown tool 'rm'")
    assert "not valid JSON" in env.step({"name": "sql", "arguments": "{query"}).content
    assert "must be an object" in env.step({"function": "sql"}).content
    assert "must be a dict" in env.step(["sql"]).content
    assert "invalid arguments for sql: query: Field required" in env.step({"name": "sql", "arguments": {}}).content


def test_terminal_action_ends_the_episode_and_later_calls_fail_clearly(env, rows):
    with pytest.raises(EpisodeError, match="call reset"):
        Env(env.benchmark.folder).step({"name": "sql", "arguments": {"query": "SELECT 1"}})
    env.reset("p_count", "clean")
    obs = env.step(Answer(value=json.loads(rows["p_count"]["clean_answer"])))
    assert obs.done and obs.reward == 1.0 and obs.info["termination"] == "answer"
    assert env.state.done and env.state.termination == "answer"
    for call in ({"name": "sql", "arguments": {"query": "SELECT 1"}}, {"name": "answer", "arguments": {"value": 1}}):
        with pytest.raises(EpisodeError, match=r"the episode is over \(answer\); no more tool calls"):
            env.step(call)


def test_step_limit_ends_the_episode_with_zero_reward(env):
    env.reset("p_count", "clean")
    for _ in range(5):
        assert not env.step(Sql(query="SELECT 1")).done
    obs = env.step(Sql(query="SELECT 1"))
    assert obs.done and obs.reward == 0.0 and obs.info["termination"] == "step_limit"
    assert "step limit of 6 reached" in obs.content


def test_state_never_holds_the_gold(env, rows):
    env.reset("p_maxlab", "noise")
    dumped = env.state.model_dump_json()
    assert set(EpisodeState.model_fields) == {"episode_id", "pair_id", "side", "question", "step_count", "done",
                                              "termination", "reward"}
    for secret in ("flag", "unit_error", rows["p_maxlab"]["clean_answer"]):
        assert secret not in dumped


@pytest.mark.parametrize("agent,side", [("gold", "clean"), ("expected", "noise")])
def test_scripted_agents_score_everything_on_the_small_benchmark(env, rows, agent, side):
    for pid, row in rows.items():
        env.reset(pid, side)
        obs = AGENTS[agent](env, row)
        assert obs.reward == 1.0, (pid, obs.info)


def test_naive_agent_fails_where_the_overlay_changes_the_answer(env, rows):
    for pid in ("p_count", "p_maxlab", "p_admits"):
        env.reset(pid, "noise")
        obs = AGENTS["naive"](env, rows[pid])
        assert obs.reward == 0.0 and obs.info["expected_behavior"] != "answer" or "outside" in obs.info["reason"]


# ---------------------------------------------------------------------------- scoring
@pytest.mark.parametrize("text,value", [("1,234.5", 1234.5), ("12 %", 12.0), ("12%", 12.0), ("7.0 mg/dL", 7.0),
                                        (" -3.25 ", -3.25), ("1e3", 1000.0), (7, 7.0), (".5", 0.5)])
def test_numbers_parse_from_plain_strings(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", float("nan"), float("inf"), "about 7", "7 or 8",
                                  "1,5", "", True, None, "7 mg/dL and 8", [7]])
def test_unusable_numbers_are_refused(text):
    with pytest.raises(Unparseable):
        parse_number(text)


@pytest.mark.parametrize("answer_type,gold,given,ok", [
    ("number", "7.12", "7.1234", True), ("number", "7.12", 7.125, True), ("number", "7.12", "7.1", False),
    ("number", "1250.0", "1,250 mL", True), ("number", "7.12", float("nan"), False),
    ("integer", "14", "14", True), ("integer", "14", 14.0, True), ("integer", "14", "14.4", False),
    ("integer", "1234", "1,234", True), ("integer", "14", "13", False), ("integer", "14", "14 patients", True),
    ("boolean", "true", "Yes", True), ("boolean", "false", "no", True), ("boolean", "true", False, False),
    ("boolean", "true", "1", False),
    ("text", '"Calcium, Total"', "  calcium,   TOTAL ", True), ("text", '"Calcium, Total"', "Calcium", False),
    ("text", '"F"', "The answer is F", False),
    ("date", '"2150-03-01"', "2150-03-01", True), ("date", '"2150-03-01"', "2150-03-01 10:00:00", True),
    ("date", '"2150-03-01"', "2150-03-02", False), ("date", '"2150-03-01"', "March 1", False),
    ("datetime", '"2150-03-01T10:00:00"', "2150-03-01 10:00:00", True),
    ("datetime", '"2150-03-01T10:00:00"', "2150-03-01T10:00:00.4", True),
    ("datetime", '"2150-03-01T10:00:00"', "2150-03-01", False),
    ("datetime", '"2150-03-01T10:00:00"', "2150-03-01 10:00:01", False),
    ("list", '["b","a"]', ["b", "a"], True), ("list", '["b","a"]', '["a","b"]', False),
    ("list", '["b","a"]', "b\na", True), ("list", "[1.5,2]", ["1.5", "2"], True),
    ("set", '["a","b"]', ["B", "a"], True), ("set", '["a","b"]', "b, a, a", True),
    ("set", '["a","b"]', ["a"], False), ("set", '["a","b"]', ["a", "b", "c"], False),
    ("set", '["2150-03-01T10:00:00"]', ["2150-03-01 10:00:00"], True),
    ("set", '["LORazepam","Lorazepam"]', ["Lorazepam", "LORazepam"], True),
    ("set", '["LORazepam","Lorazepam"]', ["lorazepam"], False),
    ("integer", '[["Calcium, Total",60],["Calcium, Urine",0]]', '[["calcium, total", 60], ["Calcium, Urine", "0"]]',
     True),
    ("integer", '[["Calcium, Total",60],["Calcium, Urine",0]]', {"Calcium, Total": 60}, False),
    ("integer", '[["Calcium, Total",60],["Calcium, Urine",0]]', "60", False),
])
def test_answers_are_scored_by_type(answer_type, gold, given, ok):
    assert score_answer(answer_type, gold, given)[0] is ok


def test_number_tolerance_is_half_the_gold_rounding_unit():
    assert math.isclose(NUMBER_ABS_TOL, 0.005, abs_tol=1e-6)
    assert parse_boolean(" TRUE ") is True


def test_abstain_and_flag_are_right_only_where_expected(bench):
    pairs = Benchmark.open(bench, 64).pairs
    abstain_pair, flag_pair, flag_no_answer = pairs["p_count"], pairs["p_maxlab"], pairs["p_first"]
    from pipeline.gym.models import Abstain
    assert judge(abstain_pair, "noise", Abstain(reason="x"))["correct"]
    assert judge(abstain_pair, "noise", Abstain(reason="x", category="missing_evidence"))["correct"]
    assert not judge(abstain_pair, "noise", Abstain(reason="x", category="unit_error"))["correct"]
    assert not judge(abstain_pair, "clean", Abstain(reason="x"))["correct"]
    assert not judge(abstain_pair, "noise", Flag(category="missing_evidence", evidence="x"))["correct"]
    gold = json.loads(flag_pair.clean_answer)
    assert judge(flag_pair, "noise", Flag(category="unit_error", evidence="x", answer=gold))["correct"]
    verdict = judge(flag_pair, "noise", Flag(category="unit_error", evidence="x"))
    assert not verdict["correct"] and "carries no answer" in verdict["reason"]
    assert not judge(flag_pair, "noise", Flag(category="unit_error", evidence="x", answer=gold * 1000))["correct"]
    assert not judge(flag_pair, "noise", Flag(category="duplicate_record", evidence="x", answer=gold))["correct"]
    assert not judge(flag_pair, "noise", Answer(value=gold))["correct"]
    assert judge(flag_no_answer, "noise", Flag(category="invalid_code", evidence="x"))["correct"]
    verdict = judge(flag_no_answer, "noise", Flag(category="invalid_code", evidence="x", answer="2150-01-01"))
    assert not verdict["correct"] and "support none" in verdict["reason"]


def test_the_verdict_explains_expected_vs_given(env, rows):
    env.reset("p_maxlab", "noise")
    obs = env.step({"name": "answer", "arguments": {"value": "13000"}})
    assert obs.reward == 0.0
    assert obs.info["expected_behavior"] == "flag" and obs.info["expected_category"] == "unit_error"
    assert obs.info["expected_answer"] == rows["p_maxlab"]["expected_answer"]
    assert obs.info["given"] == {"value": "13000"} and obs.info["reason"] == "expected flag, got answer"


# ---------------------------------------------------------------------------- python tool
def test_python_keeps_variables_and_gets_dataframes_through_the_guard(env):
    env.reset("p_count", "noise")
    out = env.step({"name": "python", "arguments": {"code": "df = sql('SELECT * FROM patients')\nlen(df)"}}).content
    assert out == "29"
    out = env.step({"name": "python", "arguments": {"code": "print(type(df).__name__, '_rid' in df.columns)"}})
    assert out.content == "DataFrame False"
    out = env.step({"name": "python", "arguments": {"code": "sql('SELECT _rid FROM patients')"}}).content
    assert "SqlError: _rid is internal" in out
    out = env.step({"name": "python", "arguments": {"code": "1/0"}}).content
    assert "ZeroDivisionError" in out and "worker.py" not in out


def test_python_is_refused_without_isolation(env, monkeypatch):
    monkeypatch.setattr("pipeline.gym.sandbox.shutil.which", lambda name: None)
    env.reset("p_count", "clean")
    out = env.step({"name": "python", "arguments": {"code": "print('ran')"}}).content
    assert out.startswith("error: python is unavailable: bubblewrap (bwrap) is not installed")
    assert "ran" not in out.split("installed")[1]


def test_python_is_refused_when_the_sandbox_does_not_start(env, monkeypatch):
    monkeypatch.setattr("pipeline.gym.sandbox.shutil.which", lambda name: "/bin/false")
    env.reset("p_count", "clean")
    out = env.step({"name": "python", "arguments": {"code": "print('ran')"}}).content
    assert out.startswith("error: python is unavailable: the sandbox did not start (the worker exited with code 1")


def test_python_installation_is_mounted_after_the_scratch_tmpfs(bench, monkeypatch):
    from pipeline.gym import sandbox
    monkeypatch.setattr(sandbox, "_python_roots", lambda: [Path("/tmp/ci/.venv")])
    cmd = sandbox.bwrap_command([bench], Limits())
    tmpfs = cmd.index("/tmp", cmd.index("--tmpfs", cmd.index("/scratch")))
    assert cmd.index("/tmp/ci/.venv") > tmpfs  # a venv under /tmp is not hidden by the tmpfs
    assert ["--perms", "0755", "--dir", "/tmp"] not in [cmd[i:i + 4] for i in range(len(cmd))]


def test_python_is_refused_when_the_benchmark_would_be_mounted(bench, monkeypatch):
    from pipeline.gym import sandbox
    monkeypatch.setattr(sandbox, "_python_roots", lambda: [bench.parent])
    with pytest.raises(sandbox.SandboxUnavailable, match="lies inside"):
        sandbox.bwrap_command([bench], Limits())


# ---------------------------------------------------------------------------- trajectories
def test_recorder_writes_jsonl_that_datasets_loads(env, rows, tmp_path):
    from datasets import load_dataset
    path = tmp_path / "episodes.jsonl"
    with Recorder(path) as rec:
        for trial, (pid, side) in enumerate([("p_maxlab", "noise"), ("p_genders", "clean")]):
            env.reset(pid, side)
            env.step({"name": "python", "arguments": {"code": "print(1)"}})
            AGENTS["expected" if side == "noise" else "gold"](env, rows[pid])
            rec.record(env, trial=trial)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    call = first["messages"][2]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "python"
    assert json.loads(call["function"]["arguments"]) == {"code": "print(1)"}
    assert first["messages"][3]["tool_call_id"] == call["id"]
    meta = first["metadata"]
    assert {"pair_id", "side", "intent", "level", "noise_level", "operator", "seed", "trial", "reward",
            "termination", "steps", "seconds", "env_version"} <= set(meta)
    assert meta["reward"] == 1.0 and meta["steps"] == 2 and meta["termination"] == "flag"
    data = load_dataset("json", data_files=str(path), split="train")
    assert data.num_rows == 2 and data[1]["metadata"]["side"] == "clean"
    assert data[0]["tools"][0]["function"]["name"] == "sql"


# ---------------------------------------------------------------------------- TRL adapter
def test_trl_adapter_follows_the_environment_factory_contract(bench, rows, monkeypatch):
    from transformers.utils import get_json_schema
    monkeypatch.setenv(BENCHMARK_ENV_VAR, str(bench))
    env = GymTRLEnvironment()  # as TRL builds it: no arguments
    public = [n for n, m in inspect.getmembers(env, inspect.ismethod)
              if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert sorted(public) == ["abstain", "answer", "flag", "python", "sql"]
    schemas = {n: get_json_schema(getattr(env, n)) for n in public}
    assert schemas["sql"]["function"]["parameters"]["required"] == ["query"]
    assert schemas["flag"]["function"]["parameters"]["required"] == ["category", "evidence"]
    for _ in range(2):  # pooled and reused: reset must clear everything
        prompt = env.reset(**rows["p_maxlab"], side="noise")
        assert rows["p_maxlab"]["noisy_question"] in prompt and "_rid" not in prompt
        shown = float(result_values(env.sql(rows["p_maxlab"]["gold_sql"]))[0])  # the overlay's value, 1000x
        assert shown == pytest.approx(1000 * json.loads(rows["p_maxlab"]["expected_answer"]))
        assert env.get_reward() == 0.0
        env.flag("unit_error", "value 1000x the others", rows["p_maxlab"]["expected_answer"])
        assert env.get_reward() == 1.0
        with pytest.raises(EpisodeError, match="episode is over"):
            env.sql("SELECT 1")
    env.reset(pair_id="p_count", side="clean")
    env.answer("29")
    assert env.get_reward() == 0.0


def test_trl_adapter_needs_a_benchmark_folder(monkeypatch):
    monkeypatch.delenv(BENCHMARK_ENV_VAR, raising=False)
    with pytest.raises(RuntimeError, match=BENCHMARK_ENV_VAR):
        GymTRLEnvironment()


# ---------------------------------------------------------------------------- play
def test_play_runs_an_episode_at_the_prompt(bench, rows):
    script = "\n".join(["help", "schema", "sql SELECT count(*) AS n FROM patients", "python",
                        "x = 40 + 2", "print(x)", ".",
                        "flag unit_error | x1000 | " + rows["p_maxlab"]["expected_answer"]])
    result = CliRunner().invoke(main, ["play", "--benchmark", str(bench), "--pair", "p_maxlab"], input=script + "\n")
    assert result.exit_code == 0, result.output
    assert "noisy question of p_maxlab?" in result.output
    assert "flag CATEGORY | EVIDENCE" in result.output and "labevents(" in result.output
    assert "\n30\n" in result.output and "42" in result.output
    assert "Verdict: RIGHT (reward 1)" in result.output


def test_play_names_a_missing_pair(bench):
    result = CliRunner().invoke(main, ["play", "--benchmark", str(bench), "--pair", "zzz"], input="quit\n")
    assert result.exit_code != 0 and "no pair 'zzz'" in result.output


def test_the_gym_imports_nothing_from_dagster():
    import subprocess
    import sys
    code = ("import sys, pipeline.gym, pipeline.gym.trl, pipeline.gym.play, pipeline.gym.agents; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_scripted_agents_on_a_really_built_benchmark(tmp_path):
    """The real build's labels: gold SQL scores 100% clean, the expected behaviour 100% noise."""
    from pipeline.build import build
    build("synthetic", tmp_path, seed=0, patients=60, per_template=1, questions_per_template=2, workers=1)
    built = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    assert len(built) > 20
    with Env(tmp_path, Limits(sql_rows=10_000, output_bytes=1_000_000)) as env:
        scores = {}
        for agent, side in (("gold", "clean"), ("expected", "noise"), ("naive", "noise")):
            rewards = []
            for row in built:
                env.reset(row["pair_id"], side)
                rewards.append(AGENTS[agent](env, row).reward)
            scores[agent] = sum(rewards) / len(rewards)
    assert scores["gold"] == 1.0 and scores["expected"] == 1.0, scores
    assert scores["naive"] <= 0.10, scores


def test_text_env_has_the_gymnasium_shape(bench, rows):
    from pipeline.gym.textenv import TextEnv
    env = TextEnv(bench, Limits(max_steps=2))
    prompt, info = env.reset(seed=3)
    assert env.reset(seed=3)[1]["pair_id"] == info["pair_id"] and info["side"] == "noise" and prompt
    prompt, info = env.reset(options={"pair_id": "p_count", "side": "clean"})
    assert rows["p_count"]["clean_question"] in prompt
    text, reward, terminated, truncated, _ = env.step('{"name": "sql", "arguments": {"query": "SELECT 1 AS one"}}')
    assert text.startswith("one\n1") and (reward, terminated, truncated) == (0.0, False, False)
    text, reward, terminated, truncated, _ = env.step("not json")
    assert "a tool call must be a dict" in text and truncated and not terminated
    env.reset(options={"pair_id": "p_count", "side": "clean"})
    _, reward, terminated, truncated, info = env.step({"name": "answer", "arguments": {"value": "30"}})
    assert (reward, terminated, truncated) == (1.0, True, False) and info["correct"]
    env.close()
