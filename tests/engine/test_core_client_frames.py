"""The API server's side of the engine core's output socket (SERVICES §1): a StepOutputs frame with one delta the
API server cannot accept costs only that delta's request (it ends with an error naming why); the other requests'
deltas in the same frame, `finished` ones included, still reach their clients."""
from __future__ import annotations

import asyncio

import msgspec
import zmq
import zmq.asyncio

from fastdeploy.engine.core_client import EngineCoreClient
from fastdeploy.schema.core_protocol import EngineStats, RequestDelta

STATS = EngineStats(num_running=2, num_waiting=0, free_slots=0, total_slots=2, free_kv_blocks=0, total_kv_blocks=8)


def test_one_invalid_delta_fails_only_its_own_request(tmp_path):
    async def scenario():
        client = EngineCoreClient("unused:builder", {})
        context = zmq.asyncio.Context()
        client._pull = context.socket(zmq.PULL)
        address = f"ipc://{tmp_path}/outputs"
        client._pull.bind(address)
        push = context.socket(zmq.PUSH)
        push.connect(address)
        queues = {rid: asyncio.Queue() for rid in ("good", "bad")}
        client._queues.update(queues)
        receiver = asyncio.create_task(client._receive_loop())
        try:
            good = RequestDelta(request_id="good", new_token_ids=[5], finished=True, finish_reason="stop")
            bad = {"request_id": "bad", "new_token_ids": [1, 2], "new_logprobs": [[9, 0.0, [], []]]}
            await push.send(msgspec.msgpack.encode({"type": "StepOutputs", "deltas": [good, bad], "stats": STATS}))
            got = {rid: await asyncio.wait_for(queue.get(), 10) for rid, queue in queues.items()}
        finally:
            receiver.cancel()
            push.close(0)
            client._pull.close(0)
            context.term()
        return got

    got = asyncio.run(scenario())
    assert got["good"].new_token_ids == [5] and got["good"].finished
    assert got["bad"].finished and got["bad"].finish_reason == "abort" and "new_logprobs" in got["bad"].error
