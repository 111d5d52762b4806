"""Admission per peer (docs/design.md §8, SERVICES §6 step 2): D's queue to one P address is full (a socket
there completes the handshake, acknowledges one reservation so that D takes slots for it, then never answers: D
awaits its answers), yet a request paired with another P is
admitted behind those waiting for the full one, its hand-off taken in and its tokens decoded; the ones for the full P keep waiting (FIFO per P) and
fail alone at their own deadlines. D's idle steps meanwhile wait for a message (never a spin). D's clock is a
FakeClock, so no deadline ends anything here."""
from __future__ import annotations

from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.model_executor.models import get_model
from fastdeploy.schema.request import RequestStatus
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from tests.splitwise.fakes import FakeClock

from .harness import toy_config
from .silent_p import SilentP
from .test_pd_zmq_faults import DEADLINES, Pair, step_until_reserved

MODEL = get_model("fd-toy")
PROMPT = MODEL.find_prompt(6, 9, seed=5)
QUEUE = 2   # D's queue to one P (SNDHWM and its reservation cap): 64 by default, the same path


def test_a_full_queue_to_one_p_delays_no_other_ps_request(monkeypatch):
    pair = Pair()
    mute = SilentP()   # completes the handshake, answers one reservation, then nothing
    try:
        pair.decode.close()
        pair.d_transport = ZmqTransport(capacity=QUEUE)
        pair.decode = build_engine(with_role(toy_config(1), "decode"), MODEL, pair.d_transport, clock=FakeClock(),
                                   deadlines=DEADLINES)
        poisoned = [pair.decode.add_request(f"poison-{i}", PROMPT, SamplingParams(max_tokens=4),
                                            disaggregate_info={"request_id": f"poison-{i}",
                                                               "prefill_addr": mute.address})
                    for i in range(QUEUE + 3)]
        step_until_reserved(pair.decode, poisoned[0])   # the probe (answering.py): P has not answered yet
        assert mute.accept_next() == "poison-0"
        step_until_reserved(pair.decode, poisoned[QUEUE])
        assert [r.status for r in poisoned] == [RequestStatus.WAITING_FOR_PEER] * (QUEUE + 1) + \
            [RequestStatus.WAITING] * 2
        deadlines = []
        poll = pair.d_transport.poll
        monkeypatch.setattr(pair.d_transport, "poll", lambda deadline=None: deadlines.append(deadline) or
                            poll(deadline))
        pair.decode.step()
        assert any(d is not None for d in deadlines), "an idle D whose head waits for a full P must wait, not spin"
        good = pair.add("good", PROMPT, max_tokens=4)
        pair.step_until(lambda: good.status is RequestStatus.FINISHED)
        assert good.finish_reason == "length" and good.error is None
        assert all(r.status is not RequestStatus.FINISHED for r in poisoned)
    finally:
        mute.close()
        pair.prefill.close()
        pair.decode.close()
