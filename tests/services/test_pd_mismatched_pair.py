"""The mismatched pair (docs/serving.md, "PD instances"): P given one prompt and D another under one request id.
D refuses P's hand-off (PD_MTP_FLOW §5.2 step 1b) and the client gets 409 naming the mismatch, not a 503 that
tells routers and clients to retry the same mistake: straight to D and through the router, streamed and not, over
ZeroMQ and over Mooncake. The router forwards the request to D once (it retries connection refusals only).

P is made to see another prompt than the one it is sent: PYTHONPATH brings P's processes a sitecustomize that drops
the last token of every prompt its API server passes to its engine core (so the router's pair mismatches too).
"""
from __future__ import annotations

import os
import threading

import httpx
import pytest

from tests.services import deployment as deploy
from tests.services.test_pd_transfer_faults import transfer_flags

BODY = {"model": "fd-toy", "prompt": "On Monday, Judy went to", "max_tokens": 8}
DROP_THE_LAST_TOKEN = '''
from fastdeploy.engine import core_client

_generate = core_client.EngineCoreClient.generate


def _generate_another_prompt(self, message):
    message.prompt_token_ids = list(message.prompt_token_ids[:-1])
    return _generate(self, message)


core_client.EngineCoreClient.generate = _generate_another_prompt
'''


@pytest.fixture(scope="module", params=["zmq", "mooncake-tcp"])
def deployment(request, tmp_path_factory):
    flags = transfer_flags(request.param)
    site = tmp_path_factory.mktemp("other-prompt")
    (site / "sitecustomize.py").write_text(DROP_THE_LAST_TOKEN)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))}
    deployment = deploy.Deployment(deploy.start_router("--splitwise"))
    try:
        deployment.add("prefill", "--splitwise-role", "prefill", *flags, env=env)
        deployment.add("decode", "--splitwise-role", "decode", *flags)
        deployment.await_ready()
        yield deployment
    finally:
        deployment.stop()


def _assert_mismatch_refused(response: httpx.Response, param: str) -> None:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert "the hand-off from P was made for another request than D's" in error["message"], error
    assert "its prompt has" in error["message"] and error["param"] == param, error


def _forwarded_to_decode(deployment) -> float:
    decode = deployment.instances["decode"]
    key = f"fastdeploy_router:requests_total{{instance=127.0.0.1:{decode.port},role=decode}}"
    return deployment.router.metrics().get(key, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_mismatched_pair_through_the_router_is_409_and_not_retried(deployment, stream):
    before = _forwarded_to_decode(deployment)
    response = httpx.post(deployment.router.url + "/v1/completions", json={**BODY, "stream": stream}, timeout=120)
    _assert_mismatch_refused(response, "disaggregate_info.request_id")
    assert _forwarded_to_decode(deployment) == before + 1
    deployment.wait_nothing_held()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_mismatched_pair_sent_straight_to_d_is_409(deployment, stream):
    prefill, decode = deployment.instances["prefill"], deployment.instances["decode"]
    rows = deploy.registered(deployment.router)
    info = {"request_id": f"cmpl-by-hand-{int(stream)}", "prefill_addr": rows[prefill.port]["connector_addr"],
            "decode_addr": rows[decode.port]["connector_addr"]}
    body = {**BODY, "stream": stream, "disaggregate_info": info}
    to_p = threading.Thread(target=lambda: httpx.post(prefill.url + "/v1/completions", json=body, timeout=120))
    to_p.start()
    try:
        response = httpx.post(decode.url + "/v1/completions", json=body, timeout=120)
    finally:
        to_p.join(120)
    _assert_mismatch_refused(response, "disaggregate_info.request_id")
    deployment.wait_nothing_held()
