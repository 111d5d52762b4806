"""The router relays SSE in whole events, so an error event injected after a failure never lands inside a
half-forwarded event (SERVICES §3: a failure after the stream started is one error chunk, then the end)."""
from __future__ import annotations

import json

import pytest

from fastdeploy.router.errors import sse_error_event
from fastdeploy.router.forward import whole_events_end


@pytest.mark.parametrize("buffer, complete", [
    (b"", b""),
    (b"data: {\"a\"", b""),
    (b"data: 1\n\n", b"data: 1\n\n"),
    (b"data: 1\n\ndata: 2", b"data: 1\n\n"),
    (b"data: 1\n\ndata: 2\n\ndata: 3\n", b"data: 1\n\ndata: 2\n\n"),
    (b"data: 1\r\n\r\ndata: 2", b"data: 1\r\n\r\n"),
])
def test_only_complete_events_are_forwarded(buffer, complete):
    """SERVICES §3: the relay cuts the upstream bytes after the last complete event."""
    assert buffer[:whole_events_end(buffer)] == complete


def test_error_event_is_one_openai_error_object():
    """SERVICES §3: the mid-stream error chunk is one SSE event carrying an OpenAI error object."""
    event = sse_error_event(502, "instance x: broken")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and whole_events_end(event) == len(event)
    body = json.loads(event[len(b"data: "):])
    assert body == {"error": {"message": "instance x: broken", "type": "bad_gateway", "param": None,
                              "code": 502}}
