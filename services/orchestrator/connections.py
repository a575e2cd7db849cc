"""The orchestrator's clients of every other service, opened from the config's addresses."""

from __future__ import annotations

import asyncio

from rlrun.common.config import POLICY, ConfigError, RunConfig
from rlrun.common.grpc_client import ClientOptions, wait_for_health
from rlrun.orchestrator.env_client import EnvClient
from rlrun.orchestrator.scoring import InferenceScorer
from rlrun.orchestrator.trainer_client import TrainerClient


def service_addresses(config: RunConfig) -> dict[str, str]:
    """label -> address of every service the run needs; a missing one is a ConfigError naming its key."""
    out: dict[str, str] = {}
    for i, env in enumerate(config.orchestrator.train.env):
        if not env.address:
            raise ConfigError(
                f"orchestrator.train.env.{i}.address", f"no env-server address for env {env.key!r}"
            )
        out[f"env-server {env.key}"] = env.address
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


async def wait_ready(addresses: dict[str, str], options: ClientOptions, timeout_s: float) -> None:
    """Waits until every service reports SERVING; a TimeoutError names the ones that did not."""
    results = await asyncio.gather(
        *(wait_for_health(address, options, timeout_s) for address in addresses.values()),
        return_exceptions=True,
    )
    missing = [
        f"{label} ({address}): {result}"
        for (label, address), result in zip(addresses.items(), results, strict=True)
        if isinstance(result, BaseException)
    ]
    if missing:
        raise TimeoutError("services not ready: " + "; ".join(missing))


class Connections:
    def __init__(self, config: RunConfig, options: ClientOptions):
        self.config = config
        self.options = options
        self.envs = {
            env.key: EnvClient(env.address or "", options, config.grpc.unavailable_retry_s)
            for env in config.orchestrator.train.env
        }
        self.trainer = TrainerClient(config.trainer.address, options, config.grpc.unavailable_retry_s)
        self._scorers: dict[str, InferenceScorer] = {}

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
