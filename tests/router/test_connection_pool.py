"""The router's pooled connections to instances (fastdeploy/router/router.py, POOL_KEEPALIVE_SECS)."""
from __future__ import annotations

import argparse

import uvicorn

from fastdeploy.entrypoints.openai.api_server import http_options
from fastdeploy.router.router import POOL_KEEPALIVE_SECS


def test_the_router_drops_an_idle_connection_before_an_instance_closes_it():
    """An idle pooled connection is dropped by the router before the instance's uvicorn closes it (its keep-alive
    timeout, as the API server configures it): otherwise a request sent on a connection the instance is closing
    that instant fails before any answer, a 502 "broken"."""
    instance = uvicorn.Config(app=None, **http_options(argparse.Namespace(ssl_keyfile=None, ssl_certfile=None)))
    assert 0 < POOL_KEEPALIVE_SECS < instance.timeout_keep_alive
