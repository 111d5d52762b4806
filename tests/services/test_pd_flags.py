"""PD flags reach the instance the engine core builds (docs/design.md §8 "Roles as processes"): a prefill instance
started with --pd-timeout-secs 1 fails a request whose reservation never comes at its 1.5 s reservation deadline,
naming that deadline, instead of after the 90 s default."""
from __future__ import annotations

import httpx

from tests.services import launcher

TIMEOUT_S = 1.0


def test_pd_timeout_secs_reaches_the_prefill_instance():
    with launcher.serving("--splitwise-role", "prefill", "--pd-timeout-secs", str(TIMEOUT_S)) as prefill:
        info = {"request_id": "cmpl-never-reserved", "prefill_addr": "127.0.0.1:9",
                "decode_addr": "127.0.0.1:9"}
        # 15 s bounds the wait far below the 90 s default deadline: a flag that did not arrive fails here
        answer = httpx.post(prefill.url + "/v1/completions", timeout=15,
                            json={"model": "fd-toy", "prompt": "Hello", "max_tokens": 4, "disaggregate_info": info})
        assert answer.status_code == 503, answer.text
        assert f"within {1.5 * TIMEOUT_S:g} s" in answer.json()["error"]["message"], answer.text
        prefill.wait_until(launcher.nothing_held, "nothing held on P")
