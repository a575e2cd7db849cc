"""rlrun/v1/training.proto: training samples and batches, validated."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlrun.common.wire import WireError
from rlrun.common.wire.trace import Channel, channels_from_proto, channels_to_proto, finite, validate_dims
from rlrun.v1 import training_pb2


@dataclass
class TrainingSample:
    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    channels: list[Channel] = field(default_factory=list)

    def validate(self, where: str = "sample", vocab_size: int | None = None) -> None:
        n = len(self.token_ids)
        if n == 0:
            raise WireError(f"{where}.token_ids", f"{where}.token_ids is empty")
        if len(self.mask) != n:
            raise WireError(
                f"{where}.mask", f"{where}.mask has {len(self.mask)} entries but token_ids has {n}"
            )
        if len(self.logprobs) != n:
            raise WireError(
                f"{where}.logprobs",
                f"{where}.logprobs has {len(self.logprobs)} entries but token_ids has {n}",
            )
        if len(self.temperatures) != n:
            raise WireError(
                f"{where}.temperatures",
                f"{where}.temperatures has {len(self.temperatures)} entries but token_ids has {n}",
            )
        finite(self.logprobs, f"{where}.logprobs")
        finite(self.temperatures, f"{where}.temperatures")
        for i, t in enumerate(self.temperatures):
            if t <= 0:
                raise WireError(
                    f"{where}.temperatures[{i}]", f"{where}.temperatures[{i}] = {t} must be positive"
                )
        if vocab_size is not None:
            for i, tok in enumerate(self.token_ids):
                if not 0 <= tok < vocab_size:
                    raise WireError(
                        f"{where}.token_ids[{i}]",
                        f"{where}.token_ids[{i}] = {tok} is outside the vocabulary [0, {vocab_size})",
                    )
        validate_dims(where, n, self.mask, self.channels, length_name="token_ids")


@dataclass
class TrainingBatch:
    step: int
    policy_version: int
    samples: list[TrainingSample]
    metrics: dict[str, float] = field(default_factory=dict)
    learning_rate: float | None = None

    def validate(self, where: str = "batch", vocab_size: int | None = None) -> None:
        if not self.samples:
            raise WireError(f"{where}.samples", f"{where}.samples is empty")
        if self.learning_rate is not None and not (
            math.isfinite(self.learning_rate) and self.learning_rate > 0
        ):
            raise WireError(
                f"{where}.learning_rate",
                f"{where}.learning_rate must be a positive finite number, got {self.learning_rate}",
            )
        for i, sample in enumerate(self.samples):
            sample.validate(f"{where}.samples[{i}]", vocab_size)
        for name, value in self.metrics.items():
            if not math.isfinite(value):
                raise WireError(
                    f"{where}.metrics[{name}]", f"{where}.metrics[{name}] is {value}, not a finite number"
                )


def sample_to_proto(sample: TrainingSample) -> training_pb2.TrainingSample:
    return training_pb2.TrainingSample(
        token_ids=sample.token_ids,
        mask=sample.mask,
        logprobs=sample.logprobs,
        temperatures=sample.temperatures,
        channels=channels_to_proto(sample.channels),
    )


@dataclass
class EncodedSamples:
    """A batch's samples in wire form, encoded while the batch is built (the CPU work of its
    SubmitBatch, done while the previous step trains); its step, version and metrics are set
    when it is submitted, since they are known only then (`trainer.submit_request_to_proto`)."""

    message: training_pb2.TrainingBatch


def encode_batch(samples: Sequence[TrainingSample]) -> EncodedSamples:
    return EncodedSamples(training_pb2.TrainingBatch(samples=[sample_to_proto(s) for s in samples]))


def batch_to_proto(batch: TrainingBatch) -> training_pb2.TrainingBatch:
    msg = training_pb2.TrainingBatch(
        step=batch.step,
        policy_version=batch.policy_version,
        samples=[sample_to_proto(s) for s in batch.samples],
        metrics=batch.metrics,
    )
    if batch.learning_rate is not None:
        msg.learning_rate = batch.learning_rate
    return msg


def batch_from_proto(
    msg: training_pb2.TrainingBatch, where: str = "batch", vocab_size: int | None = None
) -> TrainingBatch:
    samples = [
        TrainingSample(
            token_ids=list(s.token_ids),
            mask=list(s.mask),
            logprobs=list(s.logprobs),
            temperatures=list(s.temperatures),
            channels=channels_from_proto(s.channels, f"{where}.samples[{i}]"),
        )
        for i, s in enumerate(msg.samples)
    ]
    batch = TrainingBatch(
        step=msg.step,
        policy_version=msg.policy_version,
        samples=samples,
        metrics=dict(msg.metrics),
        learning_rate=msg.learning_rate if msg.HasField("learning_rate") else None,
    )
    batch.validate(where, vocab_size)
    return batch
