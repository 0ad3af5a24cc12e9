"""The ``openai`` agent against a local fake OpenAI-compatible server replaying scripted replies."""

from __future__ import annotations

import json
import pickle
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest
from gym_benchmark import make_benchmark

from pipeline.eval.agent import Usage, make_agent
from pipeline.eval.agents.openai_agent import BASE_URL_ENV, MODEL_ENV, LLMError
from pipeline.gym.env import Env
from pipeline.gym.models import Limits

KEY = "sk-test-0123456789abcdef"


class FakeServer:
    """Answers POST /v1/chat/completions with the next scripted (status, body, headers); records requests."""

    def __init__(self):
        self.script: list[tuple[int, dict, dict]] = []
        self.requests: list[dict] = []
        self.auth: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.auth.append(self.headers.get("Authorization"))
                status, reply, headers = (server.script.pop(0) if server.script else
                                          (500, {"error": {"message": "script exhausted"}}, {"x-should-retry": "false"}))
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, *calls: tuple[str, str], content: str | None = None, usage=(100, 10)) -> None:
        """Script one completion: tool calls as (name, raw arguments text), or a text reply."""
        tool_calls = [{"id": f"srv_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                      for i, (n, a) in enumerate(calls)] or None
        self.script.append((200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                         "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        }, {}))

    def fail(self, status: int, message: str = "try later", headers: dict | None = None) -> None:
        self.script.append((status, {"error": {"message": message, "type": "error"}}, headers or {}))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return make_benchmark(tmp_path_factory.mktemp("openai_bench"))


@pytest.fixture(scope="module")
def rows(bench):
    return {r["pair_id"]: r for r in pq.read_table(bench / "pairs.parquet").to_pylist()}


@pytest.fixture()
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture()
def env(bench):
    with Env(bench, Limits(max_steps=4, sql_rows=5, output_bytes=2_000)) as e:
        yield e


def agent_for(server: FakeServer, **options):
    return make_agent("openai", model="fake-model", base_url=server.url, api_key=KEY, **options)


def play(agent, env, pair_id: str, side: str = "clean", seed: int = 7) -> Usage:
    start = env.reset(pair_id, side)
    return agent.play(env, start, None, random.Random(seed))


def test_an_episode_runs_the_models_tool_calls_to_a_correct_answer(server, env, rows):
    row = rows["p_gender"]
    server.reply(("sql", json.dumps({"query": row["gold_sql"]})), usage=(120, 15))
    server.reply(("answer", json.dumps({"value": json.loads(row["clean_answer"])})), usage=(180, 8))
    agent = agent_for(server, temperature=0.5)

    usage = play(agent, env, "p_gender")

    assert env.state.done and env.state.termination == "answer" and env.reward == 1.0
    assert usage == Usage(tokens_in=300, tokens_out=23)
    assert (agent.name, agent.model, agent.uses_labels) == ("openai", "fake-model", False)
    first, second = server.requests
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["tools"] == env.tools and first["tool_choice"] == "auto" and first["temperature"] == 0.5
    assert first["model"] == "fake-model"
    # the second turn carries the gym's record of the first call and its result, once each
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][2]["tool_calls"][0]["id"] == second["messages"][3]["tool_call_id"]
    assert second["messages"][2]["content"] == ""  # a string, as llama.cpp's server requires
    assert row["gold_sql"] in second["messages"][2]["tool_calls"][0]["function"]["arguments"]
    assert [m["role"] for m in env.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert server.auth == [f"Bearer {KEY}"] * 2


def test_the_seed_sent_follows_the_episodes_rng(server, env, rows):
    answer = json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})
    agent = agent_for(server)
    for _ in range(3):
        server.reply(("answer", answer))
    for seed in (1, 1, 2):
        play(agent, env, "p_gender", seed=seed)
    seeds = [r["seed"] for r in server.requests]
    assert seeds[0] == seeds[1] != seeds[2]


def test_a_malformed_tool_call_gets_the_gyms_error_and_the_episode_goes_on(server, env, rows):
    server.reply(("answer", '{"value": "F"'))  # truncated JSON
    server.reply(("answer", json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})))

    play(agent_for(server), env, "p_gender")

    error = server.requests[1]["messages"][-1]
    assert error["role"] == "tool" and "not valid JSON" in error["content"]
    assert env.state.step_count == 2 and env.reward == 1.0


def test_text_replies_are_answered_by_the_gym_and_end_at_the_step_limit(server, env):
    for _ in range(4):
        server.reply(content="I think the answer is probably F.")

    play(agent_for(server), env, "p_gender")

    assert env.state.termination == "step_limit" and env.reward == 0.0
    assert len(server.requests) == 4  # the gym's max_steps
    nudge = server.requests[1]["messages"][-1]["content"]
    assert "unknown tool" in nudge and "answer" in nudge
    assert env.trajectory()["messages"][2]["tool_calls"][0]["function"]["arguments"].startswith("I think")


def test_several_tool_calls_in_one_reply_run_in_order_until_the_episode_ends(server, env, rows):
    answer = json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})
    server.reply(("sql", json.dumps({"query": "SELECT 1"})), ("answer", answer), ("sql", '{"query": "SELECT 2"}'))

    play(agent_for(server), env, "p_gender")

    assert len(server.requests) == 1 and env.state.step_count == 2 and env.reward == 1.0


def test_a_429_and_a_503_are_retried_with_backoff(server, env, rows):
    server.fail(429, headers={"retry-after-ms": "20"})
    server.fail(503, headers={"retry-after-ms": "20"})
    server.reply(("answer", json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})), usage=(50, 5))

    usage = play(agent_for(server, max_retries=2), env, "p_gender")

    assert len(server.requests) == 3 and env.reward == 1.0
    assert usage == Usage(tokens_in=50, tokens_out=5)  # failed attempts cost nothing


def test_retries_run_out_into_an_error_without_the_key(server, env):
    for _ in range(2):
        server.fail(500, message=f"upstream broke for key {KEY}", headers={"retry-after-ms": "10"})

    with pytest.raises(LLMError) as err:
        play(agent_for(server, max_retries=1), env, "p_gender")

    assert len(server.requests) == 2
    assert "500" in str(err.value) and server.url in str(err.value) and KEY not in str(err.value)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)  # crosses worker processes


def test_a_refused_key_is_not_retried_and_never_shown(server, env):
    server.fail(401, message=f"Incorrect API key provided: {KEY}")

    with pytest.raises(LLMError) as err:
        play(agent_for(server), env, "p_gender")

    assert len(server.requests) == 1 and KEY not in str(err.value) and "***" in str(err.value)


def test_the_key_stays_out_of_the_agent_and_the_trajectory(server, env, rows):
    server.reply(("answer", json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})))
    agent = agent_for(server)

    play(agent, env, "p_gender")

    assert KEY not in repr(agent) and KEY not in json.dumps({k: str(v) for k, v in vars(agent).items()})
    assert KEY not in json.dumps(env.trajectory(), default=str)


def test_model_and_base_url_come_from_the_environment_when_not_given(server, env, rows, monkeypatch):
    monkeypatch.setenv(BASE_URL_ENV, server.url)
    monkeypatch.setenv(MODEL_ENV, "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.reply(("answer", json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})))

    agent = make_agent("openai")
    play(agent, env, "p_gender")

    assert agent.model == "env-model" and server.requests[0]["model"] == "env-model"
    assert server.auth == [f"Bearer {KEY}"] and env.reward == 1.0


def test_a_local_server_needs_no_key(server, env, rows, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.reply(("answer", json.dumps({"value": json.loads(rows["p_gender"]["clean_answer"])})))

    play(make_agent("openai", base_url=server.url), env, "p_gender")

    assert server.auth == ["Bearer none"] and env.reward == 1.0
