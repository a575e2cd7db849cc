"""A model target of kind `openai` (issue 34 item 11): the debate's judge served by an external
OpenAI-compatible API. The external API is a real `rlrun serve inference --http-port 0` process
behind an API key; the env-server is a real `rlrun serve env-server` process that reads the key
from the environment variable the config names. Retries, the concurrency cap and the refusals
are driven against small real HTTP servers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlrun.common.config import ConfigError, load_config, resolve_config
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.service import serve_command
from rlrun.common.tokenizer import ChatMessage
from rlrun.common.wire.plan import ModelEndpoint, plan_from_proto, plan_to_proto
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.trace import TaskRef
from rlrun.env_server.sdk.errors import ModelCallError
from rlrun.env_server.sdk.openai_client import OpenAIChatClient
from rlrun.local.processes import ProcessGroup
from rlrun.orchestrator.collect.env_client import EnvClient
from rlrun.orchestrator.run.plan import compile_plans

REPO = Path(__file__).resolve().parents[3]
KEY = "sk-judge-4c1d9e77"
KEY_ENV = "RLRUN_TEST_JUDGE_KEY"
HTTP_LINE = re.compile(r"OpenAI-compatible HTTP on (http://\S+/v1)")


def judge_config(tmp_path: Path, base_url: str) -> Path:
    text = (REPO / "configs/debate.toml").read_text()
    text = text.replace(
        '[orchestrator.models.judge]\nkind = "rule"',
        f'[orchestrator.models.judge]\nkind = "openai"\nbase_url = "{base_url}"\nmodel = "debate"\n'
        f'api_key_env = "{KEY_ENV}"\nmax_concurrency = 4\nmax_retries = 2',
    )
    assert 'kind = "openai"' in text
    path = tmp_path / "debate_llm_judge.toml"
    path.write_text(text)
    return path


@pytest.fixture
def processes():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop(KEY_ENV, None)
    group = ProcessGroup(env)
    yield group
    group.stop()


def start_external_api(group: ProcessGroup, tmp_path: Path) -> tuple[str, str]:
    """A real inference process serving the OpenAI API behind KEY; (gRPC address, base URL)."""
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY)
    argv = serve_command(
        "inference",
        REPO / "configs/debate.toml",
        tmp_path / "api-logs",
        "--set",
        f"output_dir={json.dumps(str(tmp_path / 'api'))}",
        "--set",
        f"inference.api_key_file={json.dumps(str(key_file))}",
        "--set",
        "model.max_model_len=128",  # the judge's prompt holds both answers: beyond the debaters' 32
        "--http-port",
        "0",
    )
    child = group.start("external-api", argv, tmp_path / "api-logs" / "inference.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = HTTP_LINE.search(child.stderr_file.read_text())
        if found:
            return child.address, found.group(1)
        time.sleep(0.2)
    raise AssertionError(f"no HTTP URL in {child.stderr_file}")


async def test_the_debate_judge_served_by_an_external_openai_api(processes, tmp_path):
    grpc_address, base_url = start_external_api(processes, tmp_path)
    path = judge_config(tmp_path, base_url)
    overrides = [
        f"output_dir={json.dumps(str(tmp_path / 'run'))}",
        f"inference.addresses={json.dumps([grpc_address])}",
    ]
    config = load_config(path, overrides)
    # The key is in the env-server's environment only: not in the config, the plan or the logs.
    processes.env[KEY_ENV] = KEY
    argv = serve_command("env-server", path, tmp_path / "run" / "logs", "--env", "debate")
    argv += [arg for o in overrides for arg in ("--set", o)]
    env_server = processes.start("env-server", argv, tmp_path / "run" / "logs" / "env-server.log")

    plan = compile_plans(config).eval["debate"]
    judge = plan.targets["judge"].model
    assert (judge.kind, judge.base_url, judge.model, judge.api_key_env) == (
        "openai",
        base_url,
        "debate",
        KEY_ENV,
    )
    message = plan_to_proto(plan)
    assert KEY not in str(message)
    assert plan_from_proto(message) == plan
    client = EnvClient(env_server.address, ClientOptions())
    try:
        traces = await client.run_group("g0", TaskRef(env="debate", split="eval", idx=3), plan, 2, 60.0)
    finally:
        await client.close()
    judges = [t for t in traces if t.member_id == "judge"]
    assert len(judges) == 2
    for trace in judges:
        assert not trace.errors, trace.errors
        [reply] = [n for n in trace.nodes if n.role == "assistant"]
        assert any(reply.sampled_mask) and all(lp == 0.0 for lp in reply.logprobs)
        assert trace.policy_span == (0, 0)
        # The judge saw both debaters' answers, as chat messages.
        assert [n.role for n in trace.nodes] == ["user", "user", "user", "assistant"]
    api_log = (tmp_path / "api-logs" / "inference.stderr").read_text()
    assert not re.search(r"\b401\b", api_log)  # a bare "401" in a port or pid is not a refusal
    for log in (tmp_path / "run" / "logs").rglob("*"):
        if log.is_file():
            assert KEY not in log.read_text(errors="replace"), log


async def test_a_wrong_or_missing_key_is_refused_without_retries(processes, tmp_path):
    _, base_url = start_external_api(processes, tmp_path)
    endpoint = ModelEndpoint(
        "judge", "openai", base_url=base_url, model="debate", api_key_env=KEY_ENV, max_retries=3
    )
    messages = [ChatMessage("user", "judge max(12,34)")]
    with pytest.raises(ModelCallError, match=KEY_ENV) as missing:
        await OpenAIChatClient(endpoint).chat(messages, SamplingParams(max_tokens=4))
    assert not missing.value.retryable
    os.environ[KEY_ENV] = "sk-wrong-key-123"
    try:
        client = OpenAIChatClient(endpoint)
        started = time.monotonic()
        with pytest.raises(ModelCallError, match="HTTP 401") as refused:
            await client.chat(messages, SamplingParams(max_tokens=4))
        assert time.monotonic() - started < 2 and not refused.value.retryable
        assert "sk-wrong-key-123" not in str(refused.value)
        os.environ[KEY_ENV] = KEY  # read when the call is made
        choice = await client.chat(messages, SamplingParams(max_tokens=4))
        assert choice.finish_reason in ("stop", "length")
    finally:
        os.environ.pop(KEY_ENV, None)


class Flaky(BaseHTTPRequestHandler):
    """Answers `failures` requests with `status` (then OK), each after `delay_s`; counts them."""

    failures = 0
    status = 503
    delay_s = 0.0
    calls = 0
    active = 0
    peak = 0
    lock = threading.Lock()

    def do_POST(self):
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with cls.lock:
            cls.calls += 1
            cls.active += 1
            cls.peak = max(cls.peak, cls.active)
            fail = cls.calls <= cls.failures
        time.sleep(cls.delay_s)
        with cls.lock:
            cls.active -= 1
        if fail:
            self.send_response(cls.status)
            self.send_header("Retry-After", "0")
            payload = b'{"error": {"message": "busy"}}'
        else:
            self.send_response(200)
            text = "b" if body["messages"][-1]["content"].startswith("judge") else "x"
            payload = json.dumps(
                {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
            ).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    handler = type("Handler", (Flaky,), {"lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_throttling_and_server_errors_are_retried_a_bounded_number_of_times(flaky, status):
    handler, base_url = flaky
    handler.failures, handler.status = 2, status
    endpoint = ModelEndpoint("judge", "openai", base_url=base_url, model="m", max_retries=2)
    choice = await OpenAIChatClient(endpoint).chat(
        [ChatMessage("user", "judge x")], SamplingParams(max_tokens=4)
    )
    assert choice.text == "b" and handler.calls == 3
    handler.calls, handler.failures = 0, 5
    with pytest.raises(ModelCallError, match="after 3 tries") as exhausted:
        await OpenAIChatClient(endpoint).chat([ChatMessage("user", "judge x")], SamplingParams(max_tokens=4))
    assert exhausted.value.retryable and handler.calls == 3


async def test_a_client_error_is_not_retried(flaky):
    handler, base_url = flaky
    handler.failures, handler.status = 5, 400
    endpoint = ModelEndpoint("judge", "openai", base_url=base_url, model="m", max_retries=3)
    with pytest.raises(ModelCallError, match="HTTP 400"):
        await OpenAIChatClient(endpoint).chat([ChatMessage("user", "x")], SamplingParams(max_tokens=4))
    assert handler.calls == 1


async def test_connection_errors_are_retried_then_fail(unused_tcp_port):
    endpoint = ModelEndpoint(
        "judge", "openai", base_url=f"http://127.0.0.1:{unused_tcp_port}/v1", model="m", max_retries=1
    )
    with pytest.raises(ModelCallError, match="could not reach it") as failed:
        await OpenAIChatClient(endpoint).chat([ChatMessage("user", "x")], SamplingParams(max_tokens=4))
    assert failed.value.retryable and "after 2 tries" in str(failed.value)


async def test_calls_in_flight_stay_under_the_cap(flaky):
    handler, base_url = flaky
    handler.delay_s = 0.2
    endpoint = ModelEndpoint("judge", "openai", base_url=base_url, model="m", max_concurrency=2)
    client = OpenAIChatClient(endpoint)
    await asyncio.gather(
        *(client.chat([ChatMessage("user", "x")], SamplingParams(max_tokens=4)) for _ in range(6))
    )
    assert handler.calls == 6 and handler.peak == 2


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"kind": "openai", "model": "m"}, "needs base_url"),
        ({"kind": "openai", "base_url": "http://x/v1"}, "needs model"),
        ({"kind": "openai", "base_url": "http://x/v1", "model": "m", "addresses": ["a:1"]}, "not addresses"),
        ({"kind": "rule", "base_url": "http://x/v1"}, "for a target of kind `openai`"),
    ],
)
def test_an_openai_target_is_checked_when_the_config_loads(target, message):
    raw = {"orchestrator": {"train": {"env": [{"id": "debate"}]}, "models": {"judge": target}}}
    with pytest.raises(ConfigError, match=message) as error:
        resolve_config(raw)
    assert error.value.path == "orchestrator.models.judge"
