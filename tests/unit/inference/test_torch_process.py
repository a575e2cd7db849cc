"""The torch engine in a process of its own (`inference.engine_process = true`): the same
answers as plain forward passes, weight updates through the shared staging area, and what
happens when either side goes away."""

import asyncio
import glob
import os
import re
import signal

import pytest
import torch
from prometheus_client import REGISTRY

from rlrun.common.config import load_config
from rlrun.common.errors import RequestError
from rlrun.common.model import build_model
from rlrun.common.weights.grpc_stream import LayoutCache, iter_update_messages, receive_update
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.torch_engine import create_engine
from rlrun.inference.engines.torch_process import TorchEngineProcess, _ApplyStaged

from .conftest import REPO
from .test_torch_engine import argmax_loop, recomputed_logprobs

MAX_MODEL_LEN = 48


def engine_config(seed: int = 3):
    return load_config(
        REPO / "configs/reverse_text.toml",
        [
            f"model.seed={seed}",
            f"model.max_model_len={MAX_MODEL_LEN}",
            "inference.max_batch_size=4",
        ],
    )


async def messages_of(tensors, version):
    for message in iter_update_messages(tensors, version):
        yield message


def staging_files() -> set[str]:
    return set(glob.glob("/dev/shm/rlrun-weights-*"))


def test_the_torch_engine_runs_in_its_own_process_by_default():
    assert isinstance(create_engine(engine_config()), TorchEngineProcess)


async def test_answers_updates_and_stop_match_the_in_process_model():
    config = engine_config()
    model = build_model(config.model)
    files_before = staging_files()
    engine = TorchEngineProcess(config)
    await engine.start()
    try:
        assert engine.vocab_size == model.config.vocab_size
        prompts = [[5, 6, 7, 8], [10, 11], [20, 21, 22], [30]]
        greedy = SamplingParams(max_tokens=12, temperature=0.0)
        results = await asyncio.gather(*[engine.generate(p, greedy) for p in prompts])
        for prompt, [completion] in zip(prompts, results, strict=True):
            assert completion.token_ids == argmax_loop(model, prompt, 12)
            assert completion.finish_reason == "length"

        [sampled] = await engine.generate([5, 6, 7], SamplingParams(max_tokens=10, temperature=0.8))
        torch.testing.assert_close(
            torch.tensor(sampled.logprobs),
            recomputed_logprobs(model, [5, 6, 7], sampled.token_ids, 0.8),
            atol=1e-4,
            rtol=0,
        )

        # An update assembled straight into the staging area, as the gRPC servicer does it.
        other = build_model(engine_config(seed=11).model)
        update = await receive_update(
            messages_of(broadcast_tensors(other), 2),
            LayoutCache(engine.weight_specs()),
            await engine.weight_receive_buffer(),
        )
        assert engine._offsets_in_staging(update.tensors) is not None  # no copy on the way
        await engine.update_weights(update.tensors, 2)
        [after] = await engine.generate([5, 6, 7, 8], greedy)
        assert after.token_ids == argmax_loop(other, [5, 6, 7, 8], 12)
        assert (after.policy_version_start, after.policy_version_end) == (2, 2)
        assert engine.status().policy_version == 2

        # Tensors from anywhere else are copied in; a refused update changes nothing (an older
        # version is the servicer's to refuse: tests/integration/inference/test_grpc_service.py).
        broken = {**broadcast_tensors(model), "lm_head.weight": torch.zeros(1)}
        with pytest.raises(RequestError, match="lm_head.weight"):
            await engine.update_weights(broken, 4)
        [unchanged] = await engine.generate([5, 6, 7, 8], greedy)
        assert unchanged.token_ids == after.token_ids and engine.policy_version == 2
        # Received elsewhere (a buffer of its own): copied in, not read from the staging area.
        elsewhere = await receive_update(
            messages_of(broadcast_tensors(model), 3), LayoutCache(engine.weight_specs())
        )
        assert engine._offsets_in_staging(elsewhere.tensors) is None
        await engine.update_weights(elsewhere.tensors, 3)
        [back] = await engine.generate([5, 6, 7, 8], greedy)
        assert back.token_ids == argmax_loop(model, [5, 6, 7, 8], 12)

        # A sender that lists the tensors in another order: assembled in the staging area as
        # sent, and read from where each one landed.
        reordered = dict(reversed(list(broadcast_tensors(other).items())))
        update = await receive_update(
            messages_of(reordered, 4),
            LayoutCache(engine.weight_specs()),
            await engine.weight_receive_buffer(),
        )
        assert engine._offsets_in_staging(update.tensors) != engine._offsets
        await engine.update_weights(update.tensors, 4)
        [again] = await engine.generate([5, 6, 7, 8], greedy)
        assert again.token_ids == after.token_ids

        scored = await engine.score([5, 6, 7, 8, 9], 2, 1.0)
        torch.testing.assert_close(
            torch.tensor(scored.logprobs),
            recomputed_logprobs(other, [5, 6], [7, 8, 9], 1.0),
            atol=1e-4,
            rtol=0,
        )

        await engine.pause()
        held = asyncio.create_task(engine.generate([5, 6], SamplingParams(max_tokens=30, n=2)))
        while engine.status().waiting_requests == 0:
            await asyncio.sleep(0.01)
        assert engine.status().paused and not held.done()
    finally:
        await engine.stop()
    assert [c.finish_reason for c in await held] == ["abort", "abort"]
    assert staging_files() == files_before
    with pytest.raises(RuntimeError, match="not running"):
        await engine.generate([5], greedy)


async def test_an_update_is_committed_in_order_before_the_engine_copies_it_in():
    """update_weights returns once the update is queued ahead of every later request, not
    after the engine process has copied it in; the next update waits for the staging area,
    and a committed update the engine then cannot apply stops the engine loudly."""
    config = engine_config()
    models = {1: build_model(engine_config(seed=11).model), 2: build_model(config.model)}
    engine = TorchEngineProcess(config)
    died = asyncio.get_running_loop().create_future()
    engine.on_dead = died.set_result
    await engine.start()
    applied = REGISTRY.get_sample_value("rlrun_inference_weight_apply_seconds_count") or 0
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    try:
        # Decoding while the updates arrive: they land between two of its steps.
        busy = asyncio.create_task(engine.generate([5, 6], SamplingParams(max_tokens=40)))
        layouts = LayoutCache(engine.weight_specs())  # the second update reuses the first's views
        for version, model in models.items():
            update = await receive_update(
                messages_of(broadcast_tensors(model), version),
                layouts,
                await engine.weight_receive_buffer(),
            )
            await engine.update_weights(update.tensors, version)
            assert engine.policy_version == version and not engine._staged.done()
            await engine.weight_receive_buffer()
            assert engine._staged.done()  # the staging area is handed out only once copied from
            [after] = await engine.generate([5, 6, 7, 8], greedy)
            assert after.token_ids == argmax_loop(model, [5, 6, 7, 8], 12)
            assert after.policy_version_start == version
        await busy
        assert REGISTRY.get_sample_value("rlrun_inference_weight_apply_seconds_count") == applied + 2

        # Skips update_weights' checks: no tensor has an offset in the staging area.
        engine._commit(lambda rid: _ApplyStaged(rid, 3, {}), 3)
        assert "the engine process exited (exit code 1)" in str(await asyncio.wait_for(died, 30))
        with pytest.raises(RuntimeError, match="not running"):
            await engine.generate([5], greedy)
    finally:
        await engine.stop()


async def test_requests_made_right_after_an_update_returns_are_served_by_it():
    """The update reaches the engine process at the loop's next turn; a request made in the
    same turn must still go after it."""
    config = engine_config()
    other = build_model(engine_config(seed=11).model)
    engine = TorchEngineProcess(config)
    await engine.start()
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    try:
        await engine.update_weights(broadcast_tensors(other), 1)
        [after] = await engine.generate([5, 6, 7, 8], greedy)  # in the update's turn of the loop
        assert after.token_ids == argmax_loop(other, [5, 6, 7, 8], 12)
        assert after.policy_version_start == 1
    finally:
        await engine.stop()


@pytest.fixture
async def watched():
    """A started engine process, and a future set with the error it reports on dying."""
    engine = TorchEngineProcess(engine_config())
    died = asyncio.get_running_loop().create_future()
    engine.on_dead = died.set_result
    await engine.start()
    try:
        yield engine, died
    finally:
        await engine.stop()


async def test_commands_held_behind_an_update_fail_loudly_when_the_engine_is_gone(watched):
    engine, died = watched
    await engine.update_weights(broadcast_tensors(build_model(engine_config(seed=11).model)), 1)
    engine._writer.close()  # before the loop's next turn hands the update over
    with pytest.raises(RuntimeError, match="not running"):
        await engine.generate([5, 6], SamplingParams(max_tokens=4))
    assert "not running" in str(await asyncio.wait_for(died, 30))
    with pytest.raises(RuntimeError, match="not running"):
        await engine._staged


async def test_a_dead_engine_process_fails_open_requests_and_reports_itself(watched):
    engine, died = watched
    await engine.pause()
    waiting = asyncio.create_task(engine.generate([5, 6], SamplingParams(max_tokens=4)))
    while engine.status().waiting_requests == 0:
        await asyncio.sleep(0.01)
    os.kill(engine._process.pid, signal.SIGKILL)
    error = await asyncio.wait_for(died, 30)
    assert "exit code -9" in str(error)
    with pytest.raises(RuntimeError, match="exit code -9"):
        await waiting
    with pytest.raises(RuntimeError, match="not running"):
        await engine.generate([5], SamplingParams(max_tokens=2))


def test_weight_staging_falls_back_to_the_temp_folder_when_tmpfs_is_full(monkeypatch, tmp_path):
    from rlrun.inference.engines import torch_process

    monkeypatch.setattr(torch_process, "staging_directories", lambda: [str(tmp_path / "full"), str(tmp_path)])
    (tmp_path / "full").mkdir()
    reserve = os.posix_fallocate

    def full_disk(fd, offset, length):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "full")):
            raise OSError(28, "No space left on device")
        reserve(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    path, mapping = torch_process._create_staging(4096)
    assert os.path.dirname(path) == str(tmp_path) and len(mapping) == 4096
    assert os.listdir(tmp_path / "full") == []
    monkeypatch.setattr(torch_process, "staging_directories", lambda: [str(tmp_path / "full")])
    with pytest.raises(RuntimeError, match="no room for 4096 bytes"):
        torch_process._create_staging(4096)


async def test_a_model_that_fails_to_load_fails_start_with_the_reason(tmp_path):
    config = engine_config()
    config.model.path = tmp_path / "no-such-checkpoint"
    engine = TorchEngineProcess(config)
    reason = f"could not load the model: FileNotFoundError: {config.model.path} is not a checkpoint directory"
    with pytest.raises(RuntimeError, match=re.escape(reason)):
        await engine.start()
    assert engine._process.exitcode == 1
    await engine.stop()


async def test_an_engine_process_killed_while_loading_fails_start_with_the_exit_code():
    """Killed before it could say why (by the kernel's OOM killer, say)."""
    engine = TorchEngineProcess(engine_config())
    starting = asyncio.create_task(engine.start())
    while engine._process is None or engine._process.pid is None:
        await asyncio.sleep(0.001)
    os.kill(engine._process.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"exited while loading the model \(exit code -9\)"):
        await starting
    await engine.stop()
