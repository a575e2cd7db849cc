"""One rank of test_context_parallel's context group, run as a script with torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the trainer's own process group,
learner, plan and accumulate on the job's batch, then rank 0 saves the batch loss and every
parameter's full gradient."""

from __future__ import annotations

import sys

import torch

from rlrun.trainer.distributed import init_parallelism, shutdown
from rlrun.trainer.learner import build_learner
from rlrun.trainer.loss import summarize
from rlrun.trainer.packing import count_channel_tokens


def main(job: str, result: str) -> None:
    torch.set_num_threads(1)
    config, batch = torch.load(job, weights_only=False)
    parallel = init_parallelism(config.trainer)
    learner = build_learner(config, parallel)
    counts = count_channel_tokens(batch.samples)
    stats = learner.accumulate(learner.plan(batch), counts)
    grads = {}
    for name, param in learner.model.named_parameters():
        grad = param.grad
        if hasattr(grad, "full_tensor"):  # an FSDP2 shard: a collective, every rank joins it
            grad = grad.full_tensor()
        grads[name.removeprefix("module.")] = grad.detach().clone()  # DDP's wrapper prefixes names
    if parallel.rank == 0:
        loss = summarize(stats, counts.rl, counts.ce, counts.trained)["loss"]
        torch.save({"loss": loss, "grads": grads}, result)
    shutdown(parallel)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
