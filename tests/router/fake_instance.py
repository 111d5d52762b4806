"""A fake serving instance for the router tests: it registers, heartbeats, answers a controllable ``/health`` and
streams a deterministic completion, and records what it saw (requests, ``disaggregate_info``, aborts).

Run as ``python fake_instance.py --router HOST:PORT --instance ROLE:CONFIG_HASH:PORT[:CONNECTOR_PORT] ...``;
every ``--instance`` is served by its own uvicorn server in this one process (one interpreter start for a whole
deployment), and the process is meant to be stopped with SIGKILL. ``POST /control`` changes an instance's
behaviour; ``GET /events`` returns what it recorded. It imports nothing from fastdeploy on purpose: it speaks
only the HTTP contract of SERVICES §5 and §6, as a real instance must.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass(slots=True)
class InstanceSpec:
    role: str
    config_hash: str
    port: int
    connector_port: int | None
    router: str
    model: str
    interval: float


def parse_args() -> list[InstanceSpec]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", required=True)
    parser.add_argument("--instance", action="append", required=True,
                        help="ROLE:CONFIG_HASH:PORT[:CONNECTOR_PORT]")
    parser.add_argument("--model", default="fd-toy")
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    specs = []
    for text in args.instance:
        role, config_hash, port, *connector = text.split(":")
        specs.append(InstanceSpec(role, config_hash, int(port), int(connector[0]) if connector else None,
                                  args.router, args.model, args.interval))
    return specs


def completion_text(port: int, max_tokens: int) -> list[str]:
    """The deterministic tokens this instance produces: they name it, so tests see who served a request."""
    return [f"p{port}t{i} " for i in range(max_tokens)]


def build_app(args: InstanceSpec) -> FastAPI:
    control = {"health": 200, "heartbeat": True, "fail_status": None, "token_delay": 0.0, "prefill_delay": 0.0,
               "break_after": None, "reset_status": 200}
    events: list[dict] = []
    registration = {"role": args.role, "host": "127.0.0.1", "port": args.port,
                    "connector_addr": None if args.connector_port is None else f"127.0.0.1:{args.connector_port}",
                    "model": args.model, "config_hash": args.config_hash, "max_num_seqs": 8, "version": "test"}

    async def heartbeat():
        async with httpx.AsyncClient(timeout=args.interval * 4) as client:
            while True:
                if control["heartbeat"]:
                    try:
                        await client.post(f"http://{args.router}/register", json=registration)
                    except httpx.HTTPError:
                        pass  # the router may be restarting; the next heartbeat retries
                await asyncio.sleep(args.interval)

    @asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(heartbeat())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health():
        return JSONResponse({"status": control["health"]}, status_code=control["health"])

    @app.post("/control")
    async def set_control(request: Request):
        control.update(await request.json())
        return control

    @app.get("/events")
    async def get_events():
        return events

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": args.model, "object": "model", "owned_by": "test"}]}

    @app.get("/version")
    async def version():
        return {"version": "fake", "role": args.role}

    @app.post("/tokenize")
    @app.post("/detokenize")
    async def tokens(request: Request):   # says who answered and what it was sent
        return {"role": args.role, "path": request.url.path, "body": await request.json()}

    async def complete(request: Request, chat: bool):
        body = await request.json()
        info = body.get("disaggregate_info")
        request_id = info["request_id"] if info else f"cmpl-fake-{len(events)}"
        event = {"kind": "start", "request_id": request_id, "disaggregate_info": info,
                 "authorization": request.headers.get("authorization")}
        events.append(event)
        if args.role == "prefill":
            return await prefill(request, event)
        if control["fail_status"] is not None:
            return refusal(event)
        tokens = completion_text(args.port, int(body.get("max_tokens", 4)))
        if body.get("stream"):
            return StreamingResponse(stream(tokens, event, request_id, chat), media_type="text/event-stream")
        if not await hold(request, control["token_delay"] * len(tokens)):
            event["kind"] = "aborted"
            return JSONResponse({}, status_code=499)
        event["kind"] = "done"
        return {"id": request_id, "object": "chat.completion" if chat else "text_completion", "model": args.model,
                "served_by": args.port, "disaggregate_info": info,
                "choices": [{"index": 0, "finish_reason": "length",
                             **({"message": {"role": "assistant", "content": "".join(tokens)}} if chat
                                else {"text": "".join(tokens)})}],
                "usage": {"prompt_tokens": 1, "completion_tokens": len(tokens), "total_tokens": len(tokens) + 1}}

    async def hold(request: Request, seconds: float) -> bool:
        """Waits ``seconds``; False if the client disconnected meanwhile (a non-streaming abort)."""
        waited = 0.0
        while waited < seconds:
            if await request.is_disconnected():
                return False
            await asyncio.sleep(0.02)
            waited += 0.02
        return True

    def refusal(event: dict) -> JSONResponse:
        event["kind"] = "refused"
        return JSONResponse({"error": {"message": f"fake refusal {control['fail_status']}", "type": "test",
                                       "param": "prompt", "code": control["fail_status"]}},
                            status_code=control["fail_status"])

    async def prefill(request: Request, event: dict):
        # P holds its answer until it has "handed off" (or failed); a closed connection before that is an abort.
        if not await hold(request, control["prefill_delay"]):
            event["kind"] = "aborted"
            return JSONResponse({}, status_code=499)
        if control["fail_status"] is not None:
            return refusal(event)
        event["kind"] = "done"
        return {"status": "handed_off", "request_id": event["request_id"]}

    async def stream(tokens, event, request_id, chat):
        try:
            for sent, token in enumerate(tokens):
                if sent == control["break_after"]:   # the connection drops mid-stream, as when the process dies
                    raise ConnectionAbortedError("fake instance stopped mid-stream")
                await asyncio.sleep(control["token_delay"])
                delta = {"delta": {"content": token}} if chat else {"text": token}
                chunk = {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                         "model": args.model, "choices": [{"index": 0, "finish_reason": None, **delta}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            event["kind"] = "done"
            yield "data: [DONE]\n\n"
        finally:
            if event["kind"] != "done":
                event["kind"] = "aborted"

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request):
        events.append({"kind": "reset", "authorization": request.headers.get("authorization")})
        if control["reset_status"] != 200:
            return JSONResponse({"error": {"message": f"fake reset refusal {control['reset_status']}"}},
                                status_code=control["reset_status"])
        return {"status": "ok", "num_dropped_blocks": args.port % 7}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app


async def serve_all(specs: list[InstanceSpec]) -> None:
    servers = [uvicorn.Server(uvicorn.Config(build_app(spec), host="127.0.0.1", port=spec.port,
                                             log_level="warning", access_log=False)) for spec in specs]
    await asyncio.gather(*(server.serve() for server in servers))


if __name__ == "__main__":
    asyncio.run(serve_all(parse_args()))
