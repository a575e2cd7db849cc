"""Test envs for the seed-parity behaviours of the env-server (issue 34): an env-owned
algorithm configured by the run and scoring with a reference model, and a harness whose setup
takes time."""

from __future__ import annotations

import asyncio

from rlrun.common.wire.trace import Channel, Trace
from rlrun.env_server.envs.reverse_text import ReverseText
from rlrun.env_server.sdk.algorithms import AlgorithmContext, BranchResult
from rlrun.env_server.sdk.harnesses import SingleTurnHarness


class RefScoredEnv(ReverseText):
    """`ref_gap`: coef × (reference logprob − sampled logprob) on every sampled token, with
    `coef` from the run's algorithm_args and the reference scored through the run's
    `reference` model endpoint."""

    def algorithms(self):
        return {"ref_gap": self.ref_gap}

    async def ref_gap(self, traces: list[Trace], context: AlgorithmContext) -> list[BranchResult]:
        coef = float(context.args.get("coef", 1.0))
        results = []
        for trace in traces:
            tokens = trace.branch_tokens(0)
            start = tokens.sampled_mask.index(True)
            reference = await context.score("reference", tokens.token_ids, start)
            values = [0.0] * start + [
                coef * (ref - lp) if sampled else 0.0
                for ref, lp, sampled in zip(
                    reference, tokens.logprobs[start:], tokens.sampled_mask[start:], strict=True
                )
            ]
            results.append(BranchResult(trace.id, 0, [Channel("rl", values)], tokens.sampled_mask))
        return results


class SlowSetupHarness(SingleTurnHarness):
    async def setup(self, episodes):
        await asyncio.sleep(0.3)


class SlowSetupEnv(ReverseText):
    def __init__(self, **args):
        super().__init__(**args)
        self.harness = SlowSetupHarness()
