"""Client of an external OpenAI-compatible chat API: a plan target of kind `openai` (an opponent
or an LLM judge served elsewhere).

It uses only the standard library (urllib in a thread per call), so the env-server keeps its
light install. Each endpoint gets one client per worker process: at most `max_concurrency`
calls in flight, each with its own deadline; a 429, a 5xx or a connection failure is retried
up to `max_retries` times with exponential backoff (a `Retry-After` header is honoured). The
API key is read from the environment variable the target names, when the call is made; it is
sent as a bearer token and never logged or put in an error message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rlrun.common.tokenizer import ChatMessage
from rlrun.common.wire.plan import ModelEndpoint
from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.sdk.errors import InvalidModelOutput, ModelCallError

log = logging.getLogger("rlrun.env_server.openai")

DEFAULT_CONCURRENCY = 32
DEFAULT_TIMEOUT_S = 60.0
BACKOFF_S = 0.5
"""Wait before the first retry; it doubles with each further one."""
MAX_BACKOFF_S = 30.0
RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


@dataclass(frozen=True)
class ChatChoice:
    text: str
    finish_reason: str
    """As the API says it: `stop`, `length`, ..."""


class _HttpFailure(Exception):
    def __init__(self, status: int | None, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRYABLE_STATUS


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def request_body(model: str, messages: list[ChatMessage], sampling: SamplingParams) -> dict[str, Any]:
    """The chat completion request: one choice, the plan's token budget and sampling."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
    }
    if sampling.top_p < 1.0:
        body["top_p"] = sampling.top_p
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


def parse_choice(payload: Any, url: str) -> ChatChoice:
    try:
        choice = payload["choices"][0]
        text = choice["message"].get("content") or ""
        finish = choice.get("finish_reason") or "stop"
    except (KeyError, IndexError, TypeError, AttributeError):
        raise InvalidModelOutput(f"{url} answered without choices[0].message") from None
    if not isinstance(text, str):
        raise InvalidModelOutput(f"{url} answered a message whose content is not text")
    return ChatChoice(text, str(finish))


class OpenAIChatClient:
    """Chat completions from one endpoint (see the module's docstring)."""

    def __init__(self, endpoint: ModelEndpoint):
        self.endpoint = endpoint
        self.url = endpoint.base_url.rstrip("/") + "/chat/completions"
        self.concurrency = endpoint.max_concurrency or DEFAULT_CONCURRENCY
        self.timeout_s = endpoint.timeout_s or DEFAULT_TIMEOUT_S
        self._slots = asyncio.Semaphore(self.concurrency)
        self._threads = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"openai-{endpoint.name}")
        self.in_flight = 0
        self.peak_in_flight = 0

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        name = self.endpoint.api_key_env
        if name:
            key = os.environ.get(name)
            if not key:
                raise ModelCallError(
                    "UNAUTHENTICATED",
                    f"model target {self.endpoint.name!r}: the environment variable {name} that "
                    "should hold its API key is not set on this env-server",
                    retryable=False,
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post(self, body: bytes, headers: dict[str, str]) -> Any:
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read(500).decode("utf-8", "replace")
            raise _HttpFailure(
                error.code, f"HTTP {error.code}: {detail}", _retry_after(error.headers)
            ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            reason = getattr(error, "reason", error)
            raise _HttpFailure(None, f"could not reach it: {reason}") from None
        except json.JSONDecodeError:
            raise _HttpFailure(502, "the answer is not JSON") from None

    async def chat(self, messages: list[ChatMessage], sampling: SamplingParams) -> ChatChoice:
        """One chat completion, retried as the module's docstring says; a call that still fails
        is a ModelCallError (retryable when the last failure was)."""
        body = json.dumps(request_body(self.endpoint.model, messages, sampling)).encode()
        headers = self._headers()
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            async with self._slots:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                try:
                    payload = await loop.run_in_executor(self._threads, self._post, body, headers)
                    return parse_choice(payload, self.url)
                except _HttpFailure as failure:
                    error = failure
                finally:
                    self.in_flight -= 1
            where = f"{self.endpoint.name} at {self.url}"
            if not error.retryable or attempt >= self.endpoint.max_retries:
                tries = f" (after {attempt + 1} tries)" if attempt else ""
                raise ModelCallError(
                    "UNAVAILABLE" if error.retryable else "FAILED_PRECONDITION",
                    f"chat completion on {where}{tries}: {error}",
                    retryable=error.retryable,
                )
            delay = min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt) * (0.5 + random.random() / 2)
            if error.retry_after is not None:
                delay = min(MAX_BACKOFF_S, error.retry_after)
            attempt += 1
            log.warning(
                "chat completion on %s failed (%s); retry %d of %d in %.1fs",
                where,
                error,
                attempt,
                self.endpoint.max_retries,
                delay,
            )
            await asyncio.sleep(delay)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class OpenAIClients:
    """One client per endpoint (by name and URL), shared by the jobs of a worker process."""

    def __init__(self) -> None:
        self._clients: dict[tuple, OpenAIChatClient] = {}

    def get(self, endpoint: ModelEndpoint) -> OpenAIChatClient:
        key = (
            endpoint.name,
            endpoint.base_url,
            endpoint.model,
            endpoint.api_key_env,
            endpoint.max_concurrency,
            endpoint.max_retries,
            endpoint.timeout_s,
        )
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = OpenAIChatClient(endpoint)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
