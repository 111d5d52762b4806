"""The hostile-input battery through the PD router (docs/serving.md, "Limits" and "Errors"): every row of
`hostile_cases.CASES` sent to a router in front of a prefill and a decode instance gets the status a single API
server gives it, with the OpenAI error object naming the client's field (the router parses the body under the same
limits, or relays the instance's refusal), and then the router, P and D are intact: no traceback in any log,
the router's /health 200, nothing held on P or D. Plain requests straight to P and D are refused
(tests/services/test_api_pd_roles.py)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.services import deployment as deploy
from tests.services.hostile_cases import CASES, MAX_BODY, MAX_MODEL_LEN, Case
from tests.services.test_hostile_input import assert_error

LIMITS = ("--max-model-len", str(MAX_MODEL_LEN), "--max-body-bytes", str(MAX_BODY))


@pytest.fixture(scope="module")
def pd():
    deployment = deploy.pd_deployment(prefill_flags=LIMITS, decode_flags=LIMITS)
    try:
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def http(pd):
    with httpx.Client(base_url=pd.router.url, timeout=60) as client:
        yield client


def expected(case: Case) -> tuple[int, str | None]:
    """What the router answers: /tokenize and /detokenize what a decode instance answers; clients may not send
    `disaggregate_info` (the router sets it), and SGLang's pairing fields, which a mixed server ignores, clash with
    the router's pairing on P and D; otherwise what a single API server answers."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.path in ("/tokenize", "/detokenize"):
        return case.status, case.param   # relayed to a decode instance, which answers as a single API server does
    if case.path not in ("/v1/completions", "/v1/chat/completions"):
        return 404, None     # the router serves the generation and tokenizer endpoints only
    if "disaggregate_info" in body:
        return 400, "disaggregate_info"
    if case.status == 200 and "bootstrap_room" in body:
        return 400, "bootstrap_room"
    return case.status, case.param


def assert_intact(pd: deploy.Deployment, http: httpx.Client) -> None:
    for server in (pd.router, *pd.instances.values()):
        log = server.log()
        assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]
    assert http.get("/health").status_code == 200
    pd.wait_nothing_held(timeout_s=30)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_request_through_the_router_gets_its_status_and_names_the_clients_field(pd, http, case):
    content = case.body if isinstance(case.body, (str, bytes)) else json.dumps(case.body)
    response = http.post(case.path, content=content, headers={"content-type": "application/json"})
    status, param = expected(case)
    if status == 200:
        assert response.status_code == 200, response.text[:1000]
        assert "choices" in response.json()
    else:
        assert_error(response, status, param)
    assert_intact(pd, http)
