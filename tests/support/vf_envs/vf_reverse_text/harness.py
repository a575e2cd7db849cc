import functools

import httpx
import openai
import verifiers.v1 as vf


@functools.cache
def http_client() -> httpx.AsyncClient:
    """One HTTP client for every rollout of the process (its worker has one event loop).

    verifiers builds a harness for every rollout, and an `openai.AsyncOpenAI` built without an
    `http_client` builds an httpx client, and with it an SSL context: tens of ms of CPU on the
    event loop that runs every other rollout, the interception server included. With 128
    rollouts in flight that took most of a step, and connections timed out."""
    # No timeouts of its own: the endpoint is in this process, and a rollout's deadline is
    # verifiers' (its episode timeout) and rlrun's (orchestrator.rollout_timeout_s). A connect
    # timeout only failed rollouts whose worker was busy with the others.
    return httpx.AsyncClient(timeout=None)


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """One chat turn, run in-process: every model call goes through the interception
    `endpoint` with its `secret`, which records the trace (verifiers' contract for a harness
    that runs its loop in-process)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system, prompt = self.resolve_prompt(data)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        client = openai.AsyncOpenAI(
            base_url=endpoint, api_key=secret, max_retries=0, http_client=http_client()
        )
        await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")
