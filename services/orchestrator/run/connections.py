"""The orchestrator's clients of every other service, opened from the config's addresses."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import grpc

from rlrun.common.config import POLICY, ConfigError, RunConfig
from rlrun.common.grpc_client import ClientOptions, open_channel, wait_for_health
from rlrun.common.tokenizer_info import mismatch
from rlrun.common.wire.env import EnvInfo, get_info_request
from rlrun.common.wire.inference import status_from_proto, status_request
from rlrun.common.wire.plan import TokenizerInfo
from rlrun.orchestrator.collect.env_client import EnvClient
from rlrun.orchestrator.credit.scoring import InferenceScorer
from rlrun.orchestrator.run.plan import check_env_temperature
from rlrun.orchestrator.run.trainer_client import TrainerClient
from rlrun.v1 import env_pb2_grpc, inference_pb2_grpc

log = logging.getLogger(__name__)

GET_INFO = "rlrun.v1.EnvService/GetInfo"


ENV_SERVER = "env-server"
"""Label prefix of env-servers in service_addresses: they are ready by GetInfo, not health."""


def service_addresses(config: RunConfig) -> dict[str, str]:
    """label -> address of every service the run needs; a missing one is a ConfigError naming its key."""
    out: dict[str, str] = {}
    for i, env in enumerate(config.orchestrator.train.env):
        if not env.address:
            raise ConfigError(
                f"orchestrator.train.env.{i}.address", f"no env-server address for env {env.key!r}"
            )
        out[f"{ENV_SERVER} {env.key}"] = env.address
    for i, env in enumerate(config.orchestrator.eval.env):
        if not env.address:
            raise ConfigError(
                f"orchestrator.eval.env.{i}.address", f"no env-server address for eval env {env.key!r}"
            )
        out[f"{ENV_SERVER} {env.key}"] = env.address
    if not config.trainer.address:
        raise ConfigError("trainer.address", "no trainer address")
    out["trainer"] = config.trainer.address
    if not config.inference.addresses:
        raise ConfigError("inference.addresses", "no replica of the live policy is configured")
    for i, address in enumerate(config.inference.addresses):
        out[f"inference {i}"] = address
    for key, target in config.orchestrator.models.items():
        for i, address in enumerate(target.addresses):
            out[f"model {key} {i}"] = address
    return out


class NotAnEnvServer(RuntimeError):
    """The address answers, but not rlrun.v1.EnvService/GetInfo: waiting longer cannot help."""


async def wait_for_env_server(address: str, options: ClientOptions, timeout_s: float) -> None:
    """Polls GetInfo until it answers OK: external env-servers need not serve grpc.health.v1.
    An UNIMPLEMENTED answer fails at once; a TimeoutError names the last status seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last, delay = "no answer yet", 0.05
    # We poll ourselves: no channel-level retries, so each failure is seen (and reported) as is.
    async with open_channel(address, replace(options, retries=1)) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        while (remaining := deadline - loop.time()) > 0:
            try:
                await stub.GetInfo(get_info_request(), timeout=max(0.05, min(remaining, 2.0)))
                return
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise NotAnEnvServer(
                        f"{address} answers UNIMPLEMENTED to {GET_INFO}: it does not serve "
                        f"rlrun.v1.EnvService (proto/rlrun/v1/env.proto), which every env-server must "
                        f"({error.details()})"
                    ) from None
                last = f"{error.code().name}: {error.details()}"
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, 0.5)
    raise TimeoutError(f"{address} did not answer {GET_INFO} within {timeout_s:g}s (last: {last})")


async def wait_ready(addresses: dict[str, str], options: ClientOptions, timeout_s: float) -> None:
    """Waits until every service is ready: env-servers answer GetInfo, the others report
    SERVING on grpc.health.v1. A service that can never be ready fails at once, naming what it
    lacks; a TimeoutError names the ones that were not ready in time."""
    tasks = {
        asyncio.ensure_future(
            wait_for_env_server(address, options, timeout_s)
            if label.startswith(ENV_SERVER)
            else wait_for_health(address, options, timeout_s)
        ): label
        for label, address in addresses.items()
    }
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if isinstance(task.exception(), NotAnEnvServer):
                    raise RuntimeError(f"{tasks[task]} is not ready: {task.exception()}")
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    missing = [
        f"{label} ({addresses[label]}): {task.exception()}"
        for task, label in tasks.items()
        if task.exception()
    ]
    if missing:
        raise TimeoutError("services not ready: " + "; ".join(missing))


class Connections:
    def __init__(self, config: RunConfig, options: ClientOptions):
        self.config = config
        self.options = options
        self.envs = {
            env.key: EnvClient(env.address or "", options, config.grpc.unavailable_retry_s)
            for env in [*config.orchestrator.train.env, *config.orchestrator.eval.env]
        }
        self.trainer = TrainerClient(config.trainer.address, options, config.grpc.unavailable_retry_s)
        self._scorers: dict[str, InferenceScorer] = {}
        self.tokenizer = TokenizerInfo()
        """The live policy's tokenizer, as its replicas report it (set by describe_envs)."""

    async def served_tokenizer(self) -> TokenizerInfo:
        """The tokenizer every replica of the live policy serves; replicas that disagree fail."""
        served = []
        for address in self.config.inference.addresses:
            async with open_channel(address, self.options) as channel:
                stub = inference_pb2_grpc.InferenceServiceStub(channel)
                served.append(status_from_proto(await stub.GetStatus(status_request())).tokenizer)
        first = served[0]
        for address, tokenizer in zip(self.config.inference.addresses, served, strict=True):
            if tokenizer != first:
                raise ConfigError(
                    "inference.addresses",
                    f"replicas serve different tokenizers: {self.config.inference.addresses[0]} "
                    f"{first.describe()}, {address} {tokenizer.describe()}",
                )
        return first

    async def describe_envs(self) -> dict[str, EnvInfo]:
        """Every env's GetInfo, checked against the run: a declared tokenizer must be the
        live policy's, a declared temperature the configured one (plan.check_env_temperature)."""
        self.tokenizer = await self.served_tokenizer()
        orch = self.config.orchestrator
        envs = [*orch.train.env, *orch.eval.env]
        keys = [f"orchestrator.train.env.{i}" for i in range(len(orch.train.env))]
        keys += [f"orchestrator.eval.env.{i}" for i in range(len(orch.eval.env))]
        found = await asyncio.gather(*(self.envs[e.key].describe(e.key, e.id) for e in envs))
        for i, (env, description) in enumerate(zip(envs, found, strict=True)):
            if description.tokenizer is not None and (
                wrong := mismatch(description.tokenizer, self.tokenizer)
            ):
                raise ConfigError(
                    keys[i],
                    f"env {env.key!r} at {env.address} renders token ids with tokenizer "
                    f"{description.tokenizer.describe()} but the model serves {self.tokenizer.describe()} "
                    f"({'; '.join(wrong)})",
                )
            if i < len(orch.train.env):  # an eval env trains nothing: its temperature is its own
                check_env_temperature(self.config, i, description.temperature)
        return {env.key: description for env, description in zip(envs, found, strict=True)}

    def scorer(self, key: str, max_concurrency: int) -> InferenceScorer:
        """A scorer for a model key (`policy` or a key of orchestrator.models), opened once."""
        if key not in self._scorers:
            if key == POLICY:
                addresses = list(self.config.inference.addresses)
            elif key in self.config.orchestrator.models:
                addresses = list(self.config.orchestrator.models[key].addresses)
            else:
                raise ConfigError("orchestrator.models", f"no model target {key!r} to score with")
            if not addresses:
                raise ConfigError(
                    f"orchestrator.models.{key}.addresses", f"model target {key!r} has no replica"
                )
            self._scorers[key] = InferenceScorer(key, addresses, self.options, max_concurrency)
        return self._scorers[key]

    def model_concurrency(self, key: str) -> int:
        target = self.config.orchestrator.models.get(key)
        if target is None:
            raise ConfigError("orchestrator.models", f"model target {key!r} is not configured")
        return target.max_concurrency

    async def close(self) -> None:
        await asyncio.gather(
            *(client.close() for client in self.envs.values()),
            self.trainer.close(),
            *(scorer.close() for scorer in self._scorers.values()),
            return_exceptions=True,
        )
