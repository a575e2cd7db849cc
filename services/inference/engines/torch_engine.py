"""The torch engine: continuous batching over a slot KV cache, on CPU or any torch device.

By default (`inference.engine_process = true`) the engine runs in a process of its own
(`torch_process.TorchEngineProcess`), so that the gRPC and HTTP front end never holds the
GIL the decode loop needs. `TorchEngine` runs the same core (`torch_core`) on a thread of
the service's own process: what the unit tests use, and `engine_process = false`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence

import torch

from rlrun.common.config import RunConfig
from rlrun.common.model import CausalLM, build_model
from rlrun.common.weights.collective import CollectiveSource
from rlrun.common.weights.ipc import IpcSource
from rlrun.common.weights.receiver import WeightReceiver
from rlrun.inference import metrics
from rlrun.inference.engines.core_client import CoreClient
from rlrun.inference.engines.core_protocol import ApplyWeights, CoreOutput, Stop, run
from rlrun.inference.engines.static_decode import DecodeMode
from rlrun.inference.engines.torch_core import TorchEngineCore, core_settings
from rlrun.inference.engines.torch_process import TorchEngineProcess
from rlrun.inference.structured import GrammarCompiler


class _ThreadChannel:
    """Commands from the event loop to the engine thread; outputs back, one callback each."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver):
        self.loop = loop
        self._deliver = deliver
        self._cond = threading.Condition()
        self._commands: list = []

    def put(self, command) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    def receive(self, wait: bool) -> list:
        with self._cond:
            while wait and not self._commands:
                self._cond.wait()
            commands, self._commands = self._commands, []
        return commands

    def send(self, output: CoreOutput) -> None:
        self.loop.call_soon_threadsafe(self._deliver, output)


class TorchEngine(CoreClient):
    def __init__(
        self,
        model: CausalLM,
        *,
        model_name: str,
        max_model_len: int,
        max_batch_size: int,
        max_waiting: int,
        seed: int | None = None,
        grammars: GrammarCompiler | None = None,
        decode: DecodeMode = "eager",
        graph_batch_sizes: Sequence[int] = (),
    ):
        super().__init__(
            model_name=model_name,
            vocab_size=model.config.vocab_size,
            max_model_len=max_model_len,
            device=next(model.parameters()).device,
        )
        self.core = TorchEngineCore(
            model,
            max_model_len=max_model_len,
            max_batch_size=max_batch_size,
            max_waiting=max_waiting,
            seed=seed,
            grammars=grammars,
            decode=decode,
            graph_batch_sizes=graph_batch_sizes,
        )
        self.structured_outputs = grammars is not None
        self.model = self.core.model
        self._channel: _ThreadChannel | None = None
        self._thread: threading.Thread | None = None
        self._receiver = WeightReceiver(self.core.device)

    async def start(self) -> None:
        self._channel = _ThreadChannel(asyncio.get_running_loop(), self._deliver)
        self._thread = threading.Thread(target=self._run, name="torch-engine", daemon=True)
        self._thread.start()
        metrics.POLICY_VERSION.set(self._version)

    def _run(self) -> None:
        try:
            run(self.core, self._channel)
        except BaseException as error:  # run() has failed every open request and logged it
            failure = error if isinstance(error, Exception) else RuntimeError("the engine thread crashed")
            self._channel.loop.call_soon_threadsafe(lambda: self._close(failure, dead=True))

    def _send(self, command) -> None:
        if self._channel is None:
            raise RuntimeError("the engine is not started")
        self._channel.put(command)

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._dispatch(Stop())
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        self._close(RuntimeError("the engine stopped"), dead=False)

    def weight_specs(self) -> dict[str, torch.Tensor]:
        return self.core.tensors

    async def _apply(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        if self.core.device.type != "cpu":
            device = self.core.device
            tensors = await asyncio.to_thread(lambda: {n: t.to(device) for n, t in tensors.items()})
        # The core copies from the caller's tensors, which are free again once this returns.
        await asyncio.shield(self._commit(lambda rid: ApplyWeights(rid, version, tensors), version))

    def _fetch_command(self, rid: int, source: IpcSource | CollectiveSource, version: int) -> ApplyWeights:
        return ApplyWeights(rid, version, self._receiver.source(source))


def create_engine(config: RunConfig):
    """The engine `rlrun serve inference` runs for `inference.engine = "torch"`."""
    if config.inference.engine_process:
        return TorchEngineProcess(config)
    model = build_model(config.model, device=config.inference.device, lora=config.trainer.lora)
    return TorchEngine(model, model_name=config.name, **core_settings(config))
