"""Client and AsyncClient with named tensors (protocol version 2) against a tiny real ROUTER server in a thread:
a dict of arrays goes out one frame each, a dict of outputs comes back by name (the array, for one output)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from packrat_daemon.wire.client import AsyncClient, Client
from packrat_daemon.wire.server_replies import encode_tensors_result
from packrat_daemon.wire.server_side import InferRequest, InfoRequest, Tensor
from tests.packrat_daemon.wire.test_client import Request, Server


def sums_and_counts(req: Request) -> list[list[object]]:
    """Answers each version-2 request with two outputs: the sum of its inputs per sample, and how many it had."""
    assert isinstance(req, InferRequest) and req.tensors is not None
    arrays = [np.frombuffer(t.payload, np.float32).reshape(t.shape) for t in req.tensors]
    total = np.sum([a.reshape(len(a), -1).sum(axis=1) for a in arrays], axis=0).astype(np.float32)[:, None]
    count = np.full((req.shape[0], 1), len(arrays), np.int64)
    outputs = [Tensor("sum", "float32", total.shape, total.data.cast("B")),
               Tensor("count", "int64", count.shape, count.data.cast("B"))]  # fmt: skip
    return [encode_tensors_result(req.request_id, outputs, 0.1, 1.0, 1.1, 1)]


def one_output(req: Request) -> list[list[object]]:
    assert isinstance(req, InferRequest) and not isinstance(req, InfoRequest) and req.tensors is not None
    first = np.frombuffer(req.tensors[0].payload, np.float32).reshape(req.tensors[0].shape) * 2
    return [encode_tensors_result(req.request_id, [Tensor("double", "float32", first.shape, first.data.cast("B"))],
                                  0.1, 1.0, 1.1, 1)]  # fmt: skip


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def inputs() -> dict[str, np.ndarray]:
    return {"a": np.ones((3, 2), np.float32), "b": np.arange(9, dtype=np.float32).reshape(3, 3)}


def test_a_dict_of_arrays_goes_out_by_name_and_several_outputs_come_back_by_name(context: zmq.Context) -> None:
    server = Server(context, sums_and_counts)
    try:
        with Client(server.endpoint, context=context, timeout=5) as client:
            answer = client.infer(inputs())
        assert isinstance(answer, dict) and list(answer) == ["sum", "count"]
        np.testing.assert_array_equal(answer["sum"][:, 0], [5.0, 14.0, 23.0])
        np.testing.assert_array_equal(answer["count"][:, 0], [2, 2, 2])
        (request,) = server.received
        assert isinstance(request, InferRequest) and request.tensors is not None
        assert [(t.name, t.shape) for t in request.tensors] == [("a", (3, 2)), ("b", (3, 3))]
    finally:
        server.stop()


def test_one_output_comes_back_as_the_array_and_the_async_client_does_the_same(context: zmq.Context) -> None:
    server = Server(context, one_output)
    try:
        with Client(server.endpoint, context=context, timeout=5) as client:
            np.testing.assert_array_equal(client.infer({"a": inputs()["a"]}), inputs()["a"] * 2)

        async def main() -> object:
            async with AsyncClient(server.endpoint, context=context, timeout=5) as client:
                return await asyncio.gather(*(client.infer({"a": inputs()["a"] * k}) for k in range(3)))

        for k, answer in enumerate(asyncio.run(main())):  # type: ignore[arg-type]
            np.testing.assert_array_equal(answer, inputs()["a"] * 2 * k)
    finally:
        server.stop()


def test_arrays_of_different_sample_counts_are_refused_before_sending(context: zmq.Context) -> None:
    server = Server(context, one_output)
    try:
        with Client(server.endpoint, context=context, timeout=5) as client, pytest.raises(ValueError, match="differ"):
            client.infer({"a": np.zeros((2, 1), np.float32), "b": np.zeros((3, 1), np.float32)})
        assert server.received == []
    finally:
        server.stop()
