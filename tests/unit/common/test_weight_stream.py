"""The weight-broadcast stream: chunking, and every check the receiver makes before applying."""

from pathlib import Path

import pytest
import torch
import xxhash

from rlrun.common.config import ModelConfig
from rlrun.common.model import build_model
from rlrun.common.weights.grpc_stream import (
    MAX_CHUNK_BYTES,
    LayoutCache,
    WeightAssembler,
    iter_update_messages,
)
from rlrun.common.weights.protocol import TensorLayout, broadcast_tensors
from rlrun.common.wire import WireError
from rlrun.common.wire.weights import header_from_proto, update_message_from_proto

REPO = Path(__file__).resolve().parents[3]


def model(seed=0, config="tiny-d64.json"):
    return build_model(ModelConfig(config=REPO / "configs/models" / config, seed=seed))


def assembler_for(header, expected, buffer=None):
    header = header_from_proto(header)
    return WeightAssembler(header, TensorLayout(header.tensors, expected), buffer)


def receive(messages, expected):
    messages = list(messages)
    assembler = assembler_for(messages[0].header, expected)
    for m in messages[1:]:
        assembler.add(update_message_from_proto(m))
    return assembler.finish()


@pytest.mark.parametrize("chunk", [MAX_CHUNK_BYTES, 1000, 4096 * 3 + 7])
def test_round_trip_with_any_chunk_size(chunk):
    sender, receiver = model(1), model(2)
    messages = list(iter_update_messages(broadcast_tensors(sender), version=5, chunk_bytes=chunk))
    assert messages[0].WhichOneof("payload") == "header" and messages[0].header.version == 5
    assert all(len(m.chunk.data) <= min(chunk, MAX_CHUNK_BYTES) for m in messages[1:])
    assert [m.chunk.index for m in messages[1:]] == list(range(len(messages) - 1))
    received = receive(messages, broadcast_tensors(receiver))
    for name, tensor in broadcast_tensors(sender).items():
        assert torch.equal(received[name], tensor), name


def test_tied_embeddings_send_one_tensor():
    tied = model(config="tiny-d128.json")
    assert "lm_head.weight" not in broadcast_tensors(tied)
    assert "lm_head.weight" in broadcast_tensors(model())


def test_bfloat16_survives():
    tensors = {"w": torch.randn(3, 5).to(torch.bfloat16)}
    out = receive(iter_update_messages(tensors, 1), {"w": torch.zeros(3, 5, dtype=torch.bfloat16)})
    assert torch.equal(out["w"], tensors["w"])


def test_received_tensors_are_views_of_the_receive_buffer():
    tensors = broadcast_tensors(model(1))
    messages = list(iter_update_messages(tensors, 1))
    assembler = assembler_for(messages[0].header, broadcast_tensors(model(2)))
    for m in messages[1:]:
        assembler.add(update_message_from_proto(m))
    out = assembler.finish()
    assembler.buffer[:] = bytes(len(assembler.buffer))  # zeroing the buffer zeroes every tensor
    assert all(not t.any() for t in out.values())


def test_mixed_dtypes_survive():
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(7, dtype=torch.int64).reshape(7, 1),
        "d": torch.randn(2, 3).to(torch.float16),
        "e": torch.randn(4).double(),
    }
    expected = {name: torch.zeros_like(t) for name, t in tensors.items()}
    for chunk in (MAX_CHUNK_BYTES, 5):
        out = receive(iter_update_messages(tensors, 1, chunk_bytes=chunk), expected)
        for name, tensor in tensors.items():
            assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def test_receiver_rejects_mismatches():
    tensors = broadcast_tensors(model(1))
    header = next(iter_update_messages(tensors, 1)).header
    wrong_shape = {**tensors, "lm_head.weight": torch.zeros(3, 3)}
    with pytest.raises(WireError, match="has shape"):
        assembler_for(header, wrong_shape)
    wrong_dtype = {**tensors, "lm_head.weight": tensors["lm_head.weight"].double()}
    with pytest.raises(WireError, match="has dtype"):
        assembler_for(header, wrong_dtype)
    extra = {**tensors, "extra.weight": torch.zeros(1)}
    with pytest.raises(WireError, match="missing"):
        assembler_for(header, extra)
    header.total_bytes += 4
    with pytest.raises(WireError) as error:
        assembler_for(header, tensors)
    assert error.value.field == "header.total_bytes"


def test_receiver_rejects_broken_streams():
    tensors = broadcast_tensors(model(1))
    messages = list(iter_update_messages(tensors, 3, chunk_bytes=100_000))
    assert messages[0].header.checksum == xxhash.xxh3_64_intdigest(
        b"".join(m.chunk.data for m in messages[1:])
    )
    with pytest.raises(WireError, match="stream ended"):
        receive(messages[:-1], tensors)
    corrupted = list(iter_update_messages(tensors, 3, chunk_bytes=100_000))
    corrupted[2].chunk.data = bytes(len(corrupted[2].chunk.data))
    with pytest.raises(WireError, match="checksum"):
        receive(corrupted, tensors)
    out_of_order = [messages[0], messages[2], messages[1], *messages[3:]]
    with pytest.raises(WireError, match="expected 0"):
        receive(out_of_order, tensors)


def test_empty_and_scalar_tensors_round_trip():
    tensors = {"empty": torch.zeros(0, 4), "scalar": torch.tensor(3.5), "w": torch.randn(2, 3)}
    expected = {name: torch.zeros_like(t) for name, t in tensors.items()}
    out = receive(iter_update_messages(tensors, 1), expected)
    for name, tensor in tensors.items():
        assert torch.equal(out[name], tensor), name


def test_a_tensor_list_is_checked_once_and_a_reused_buffer_keeps_its_views():
    tensors = broadcast_tensors(model(1))
    expected = broadcast_tensors(model(2))
    layouts = LayoutCache(expected)
    headers = [header_from_proto(next(iter_update_messages(tensors, version)).header) for version in (1, 2)]
    first = layouts.layout(headers[0])
    assert layouts.layout(headers[1]) is first  # same tensor list, another version: not rechecked

    # Every update assembled in the receiver's own buffer: its views are built once and
    # show each update's bytes.
    buffer = memoryview(bytearray(first.total_bytes))
    received = []
    for version, source in ((1, model(3)), (2, model(4))):
        sent = broadcast_tensors(source)
        header, *chunks = map(update_message_from_proto, iter_update_messages(sent, version))
        assembler = WeightAssembler(header, layouts.layout(header), buffer)
        for chunk in chunks:
            assembler.add(chunk)
        out = assembler.finish()
        assert all(torch.equal(out[name], t) for name, t in sent.items())
        received.append(out)
    assert all(received[0][name] is received[1][name] for name in expected)
    # No receiver buffer (a new one each time): nothing of it is kept.
    for version in (3, 4):
        header, *chunks = map(update_message_from_proto, iter_update_messages(tensors, version))
        assembler = WeightAssembler(header, first)
        for chunk in chunks:
            assembler.add(chunk)
        assert torch.equal(assembler.finish()["lm_head.weight"], tensors["lm_head.weight"])
        assert first._kept.buffer is buffer

    # Another tensor list is checked again, and a bad one leaves the checked layout in place.
    reordered = dict(reversed(list(tensors.items())))
    other = layouts.layout(header_from_proto(next(iter_update_messages(reordered, 5)).header))
    assert other is not first and [e[0] for e in other.entries] == list(reordered)
    bad = {**tensors, "lm_head.weight": torch.zeros(3, 3)}
    with pytest.raises(WireError, match="has shape"):
        layouts.layout(header_from_proto(next(iter_update_messages(bad, 6)).header))
    assert layouts.layout(header_from_proto(next(iter_update_messages(reordered, 7)).header)) is other
