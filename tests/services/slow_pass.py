"""An API server whose model pass sleeps PASS_S on every step (`python -m tests.services.slow_pass FLAGS`): the
stand-in for one legal long step (an 8k-token prefill, a device that takes its time), for the liveness tests.

The API server is the real one; only its engine core's builder differs: it builds the real instance, then wraps
the runner's `execute_model` so that each pass sleeps first (the sleep releases the interpreter, as the model's
native calls do)."""
from __future__ import annotations

import os
import sys
import time

from fastdeploy.entrypoints.openai.api_server import parse_args, run_server

PASS_S_ENV = "FD_TEST_SLOW_PASS_S"   # the test sets it: its pass time scales with the machine's load
PASS_S = float(os.environ.get(PASS_S_ENV, "6.0"))


def build_instance(args):
    from fastdeploy.entrypoints.instance_builder import build_instance as build_real_instance   # Paddle: core only
    instance = build_real_instance(args)
    execute = instance.runner.execute_model

    def slow_execute(plan):
        time.sleep(PASS_S)
        return execute(plan)

    instance.runner.execute_model = slow_execute
    return instance


if __name__ == "__main__":
    sys.exit(run_server(parse_args(sys.argv[1:]), builder="tests.services.slow_pass:build_instance"))
