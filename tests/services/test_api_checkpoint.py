"""The API server serving a checkpoint directory (`--model PATH`): a tiny random ERNIE-4.5 checkpoint written by
the test with NumPy (tests/checkpoint_files.py; no torch needed) with its sentencepiece tokenizer and chat template
(tests/tokenizer_files.py). The served name is the directory's; the chat prompt is the checkpoint's template;
a chat streams the text it answers non-streamed; a stop string ends the text wherever the tokens fall; a
checkpoint without a tokenizer is refused at start in one line."""
from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.checkpoint_files import write_numpy_checkpoint
from tests.services import launcher

NAME = "ERNIE-4.5-tiny-test"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "你好，你是谁？"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("ckpt") / NAME, tokenizer=True)


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    with launcher.serving("--max-num-seqs", "2", model=str(checkpoint),
                          log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


def _stream(server, path: str, body: dict) -> tuple[list[str], str | None]:
    pieces, finish = [], None
    with httpx.stream("POST", f"{server.url}{path}", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"].get("content") if "delta" in choice else choice["text"]
            pieces.append(delta or "")
            finish = choice.get("finish_reason") or finish
    return pieces, finish


def test_models_reports_the_directory_name_and_the_checkpoint_length(server):
    cards = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    assert [c["id"] for c in cards] == [NAME]
    assert cards[0]["max_model_len"] == 512          # config.json's max_position_embeddings (fits the KV budget)


def test_the_model_path_as_given_is_accepted_as_the_model_name(server, checkpoint):
    """vLLM serves the --model string as given: a client that copies it from the command line is answered (the
    directory's name stays the one reported)."""
    body = {"model": str(checkpoint), "prompt": "hello", "max_tokens": 2}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == NAME
    assert httpx.post(f"{server.url}/v1/completions", json={**body, "model": "other"}, timeout=60).status_code == 404


def test_chat_prompt_is_the_checkpoint_template_without_bos(server, checkpoint):
    from fastdeploy.tokenizer import get_tokenizer   # no Paddle in this process
    tokenizer = get_tokenizer(str(checkpoint))
    body = httpx.post(f"{server.url}/tokenize", json={"messages": MESSAGES, "return_token_strs": True},
                      timeout=10).json()
    expected = "<|begin_of_sentence|>be brief\nUser: 你好，你是谁？\nAssistant: "
    assert body["tokens"] == tokenizer.encode(expected, add_special_tokens=False)
    assert body["token_strs"][0] == "<|begin_of_sentence|>" and tokenizer.bos_token_id not in body["tokens"]
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": body["tokens"]}, timeout=10).json()["prompt"] \
        == expected.replace("<|begin_of_sentence|>", "")


def test_chat_streams_the_non_streamed_text(server):
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 40, "temperature": 0}
    whole = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    text = whole["choices"][0]["message"]["content"]
    pieces, finish = _stream(server, "/v1/chat/completions", body)
    assert "".join(pieces) == text and finish == whole["choices"][0]["finish_reason"]
    assert whole["usage"]["completion_tokens"] > 0 and text


def test_stop_string_ends_the_text_wherever_the_tokens_fall(server):
    """A stop string taken from the middle of the greedy text: the text ends before it, finish_reason "stop",
    streamed and not (the engine matches stop strings as token ids; the server finds the text)."""
    body = {"model": NAME, "prompt": "hello world", "max_tokens": 48, "temperature": 0}
    text = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    start = next((k for k in range(len(text) // 3, len(text) - 2)
                  if "\ufffd" not in text[k:k + 2] and text.find(text[k:k + 2]) == k), None)
    assert start is not None, text
    stop = text[start:start + 2]
    stopped = httpx.post(f"{server.url}/v1/completions", json={**body, "stop": [stop]}, timeout=60).json()
    assert stopped["choices"][0]["text"] == text[:start]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    pieces, finish = _stream(server, "/v1/completions", {**body, "stop": [stop]})
    assert "".join(pieces) == text[:start] and finish == "stop"


def _stop_across_tokens(text: str, offsets: list[int]) -> str:
    """Two characters of the text on either side of a token boundary (`offsets`: where each token's text starts),
    one of the two tokens longer than a character: the stop string's own ids are not what the model emitted there,
    so the engine's id match misses it."""
    ends = offsets[1:] + [len(text)]
    for i in range(1, len(offsets)):
        at = offsets[i]
        wide = ends[i - 1] - offsets[i - 1] > 1 or ends[i] - at > 1
        stop = text[at - 1:at + 1]
        if wide and 0 < at < len(text) and text.find(stop) == at - 1 and "\ufffd" not in stop and stop.strip():
            return stop
    raise AssertionError(f"no token boundary to cut in {text!r} at {offsets}")


def test_usage_after_a_stop_string_is_the_same_every_run_and_counts_the_logprobs(server):
    """A stop string across token boundaries (the server, not the engine's id match, ends the request): 20 greedy
    runs report the same completion_tokens, as many as the logprob entries and fewer than without the stop. (The
    chat form goes through the same choice; this random model's chat text is bytes that cut no character.)"""
    body = {"model": NAME, "prompt": "hello world", "max_tokens": 48, "temperature": 0, "logprobs": 0}

    def run(**extra) -> tuple[int, int, str, str, list[int]]:
        reply = httpx.post(f"{server.url}/v1/completions", json={**body, **extra}, timeout=60).json()
        choice = reply["choices"][0]
        logprobs = choice["logprobs"]
        return (reply["usage"]["completion_tokens"], len(logprobs["tokens"]), choice["finish_reason"],
                choice["text"], [o - logprobs["text_offset"][0] for o in logprobs["text_offset"]])

    free, _, _, text, offsets = run()
    stop = _stop_across_tokens(text, offsets)
    runs = {run(stop=[stop])[:4] for _ in range(20)}
    assert len(runs) == 1, runs
    ((completion, entries, finish, cut),) = runs
    assert finish == "stop" and cut == text[:text.index(stop)] and completion == entries < free


def test_a_checkpoint_without_a_tokenizer_is_refused_at_start(checkpoint, tmp_path):
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (bare / name).symlink_to(checkpoint / name)
    server = launcher.start(model=str(bare), wait_ready=False, log_dir=tmp_path)
    try:
        assert server.process.wait(60) == 2
    finally:
        launcher.stop(server)
    lines = [line for line in server.log().splitlines() if line.strip()]
    assert lines == [f"fastdeploy.entrypoints.openai.api_server: error: --model: {bare}: no tokenizer: the "
                     "directory has neither tokenizer.json nor tokenizer.model (with tokenizer_config.json)"]


def test_weights_that_do_not_match_the_config_end_the_server_with_one_line(checkpoint, tmp_path):
    """Weights are checked against config.json where they load, in the engine core: a tensor of another shape than
    the config describes ends the server with status 1, and the log names the tensor in one line, without a
    traceback."""
    broken = tmp_path / "other-shape"
    broken.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            (broken / path.name).symlink_to(path)
    config = json.loads((checkpoint / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] * 2}))
    server = launcher.start(model=str(broken), wait_ready=False, log_dir=tmp_path)
    try:
        assert server.process.wait(120) == 1
    finally:
        launcher.stop(server)
    log = server.log()
    assert "mlp" in log and "Traceback" not in log, log[-2000:]


def test_serve_pd_1p2d_answers_the_single_instance_text(server, checkpoint):
    """`fastdeploy serve --pd --model PATH --num-decode 2`: every instance serves the checkpoint (the path is
    passed to each), the router reports the directory's name, and a chat returns the single instance's text,
    streamed and not."""
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    single = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    pd = launcher.start("--pd", "--num-decode", "2", "--max-num-seqs", "2", model=str(checkpoint),
                        module="fastdeploy.entrypoints.cli", subcommand="serve", wait_ready=False)
    try:
        pd.wait_until(lambda s: "ready: PD deployment" in s.log(), "the ready line", launcher.START_TIMEOUT_S)
        assert [c["id"] for c in httpx.get(f"{pd.url}/v1/models", timeout=10).json()["data"]] == [NAME]
        answer = httpx.post(f"{pd.url}/v1/chat/completions", json=body, timeout=60).json()
        assert answer["choices"][0]["message"]["content"] == single["choices"][0]["message"]["content"]
        pieces, _ = _stream(pd, "/v1/chat/completions", body)
        assert "".join(pieces) == single["choices"][0]["message"]["content"]
    finally:
        launcher.stop(pd, signal.SIGINT)
        print(f"---- fastdeploy serve --pd log ----\n{pd.log()[-6000:]}")
