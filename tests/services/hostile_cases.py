"""The hostile-input battery's cases as data (docs/serving.md, "Limits" and "Errors"): one row per bad or edge
request, with the status it must get and the client field its error must name.

A row is `Case(id, path, body, status, param)`: `body` is a dict (sent as JSON), or str / bytes sent as they are;
`param` is the expected `error.param` (None: no single field is at fault). Status 200 rows are edge requests that
must succeed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

MAX_MODEL_LEN = 4096                            # long requests stay in flight while a test acts
MAX_BODY = 64 * 1024
HUGE_INT = "9" * 5000                          # a 5000-digit integer
SURROGATE = "\\ud800"                          # a lone surrogate, as a JSON escape
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@dataclass(frozen=True)
class Case:
    id: str
    path: str
    body: dict | str | bytes
    status: int
    param: str | None = None


def completion(**fields) -> dict:
    return {"model": "fd-toy", "prompt": "Hello", "max_tokens": 2, **fields}


def chat(**fields) -> dict:
    return {"model": "fd-toy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}


def _raw_with(path: str, base: dict, field: str, literal: str) -> tuple[str, str]:
    """A body whose `field` holds `literal` verbatim (numbers and escapes json.dumps cannot write)."""
    marker = "__RAW__"
    return path, json.dumps({**base, field: marker}).replace(json.dumps(marker), literal)


# (field, bad value, expected param) for the fields both endpoints share; each row runs on both endpoints
WRONG_VALUES = [
    ("max_tokens", "5", "max_tokens"), ("max_tokens", 1.5, "max_tokens"), ("max_tokens", True, "max_tokens"),
    ("max_tokens", [], "max_tokens"), ("max_tokens", 0, "max_tokens"), ("max_tokens", -1, "max_tokens"),
    ("max_tokens", 2 ** 63, "max_tokens"), ("max_tokens", 2 ** 64, "max_tokens"),
    ("max_tokens", MAX_MODEL_LEN, "max_tokens"),
    ("min_tokens", -1, "min_tokens"), ("min_tokens", "x", "min_tokens"), ("min_tokens", 9, "min_tokens"),
    ("temperature", "hot", "temperature"), ("temperature", -0.1, "temperature"), ("temperature", True, "temperature"),
    ("temperature", [1], "temperature"),
    ("top_p", 0, "top_p"), ("top_p", 1.01, "top_p"), ("top_p", "x", "top_p"), ("top_p", -1, "top_p"),
    ("seed", -1, "seed"), ("seed", "1", "seed"), ("seed", 1.5, "seed"), ("seed", 2 ** 63, "seed"),
    ("stop", 5, "stop"), ("stop", [1], "stop[0]"), ("stop", [""], "stop"), ("stop", ["x" * 17], "stop"),
    ("stop", ["a", "b", "c", "d", "e"], "stop"), ("stop", {"a": 1}, "stop"), ("stop", ["ok", None], "stop[1]"),
    ("stop_token_ids", [-1], "stop_token_ids[0]"), ("stop_token_ids", "x", "stop_token_ids"),
    ("stop_token_ids", [999], "stop_token_ids"),
    ("stream", "yes", "stream"), ("stream", 1, "stream"),
    ("stream_options", "x", "stream_options"), ("stream_options", {"include_usage": True}, "stream_options"),
    ("n", 0, "n"), ("n", 129, "n"), ("n", "2", "n"), ("n", 1.5, "n"),
    ("user", 5, "user"), ("include_stop_str_in_output", "yes", "include_stop_str_in_output"),
    ("model", 5, "model"), ("top_logprobs", 2, "top_logprobs"), ("best_of", 2, "best_of"), ("echo", True, "echo"),
    ("presence_penalty", 2.5, "presence_penalty"), ("frequency_penalty", -3, "frequency_penalty"),
    ("repetition_penalty", -1.2, "repetition_penalty"), ("repetition_penalty", "x", "repetition_penalty"),
    ("top_k", 1.5, "top_k"), ("top_k", -2, "top_k"), ("min_p", 1.5, "min_p"), ("logit_bias", {"1": 2}, "logit_bias"),
    ("disaggregate_info", {"request_id": "abc"}, "disaggregate_info"), ("disaggregate_info", "x", "disaggregate_info"),
    ("disaggregate_info", {"request_id": 5}, "disaggregate_info.request_id"),
    ("disaggregate_info", {"request_id": "a b"}, "disaggregate_info.request_id"),
    ("disaggregate_info", {"request_id": "x", "extra": 1}, "disaggregate_info.extra"),
    ("bootstrap_port", 0, "bootstrap_port"), ("bootstrap_port", 70000, "bootstrap_port"),
    ("bootstrap_room", -1, "bootstrap_room"), ("bootstrap_host", 5, "bootstrap_host"),
    ("colour", "blue", "colour"), ("Temperature", 1, "Temperature"), ("stream_options", {"bogus": 1},
                                                                       "stream_options.bogus"),
]

# (field, JSON literal written verbatim, expected param): numbers beyond int64 / double, lone surrogates
RAW_VALUES = [
    ("max_tokens", HUGE_INT, "max_tokens"), ("seed", HUGE_INT, "seed"), ("n", HUGE_INT, "n"),
    ("min_tokens", "-" + HUGE_INT, "min_tokens"), ("temperature", HUGE_INT, "temperature"),
    ("temperature", "1e400", "temperature"), ("top_p", "-1e400", "top_p"),
    ("stop_token_ids", f"[1, {HUGE_INT}]", "stop_token_ids[1]"), ("max_tokens", "1" + "0" * 20, "max_tokens"),
    ("stop", f'"a{SURROGATE}"', "stop"), ("stop", f'["ok", "{SURROGATE}b"]', "stop[1]"),
    ("user", f'"{SURROGATE}"', "user"), ("model", f'"fd{SURROGATE}"', "model"),
    ("stop", '"\\udc00"', "stop"), ("user", '"\\udfff\\ud800"', "user"),
]


def _shared_rows() -> list[Case]:
    rows = []
    for path, base, tag in ((COMPLETIONS, completion(), "cmpl"), (CHAT, chat(), "chat")):
        for field, value, param in WRONG_VALUES:
            status = 404 if field == "model" and isinstance(value, str) else 400
            rows.append(Case(f"{tag}-{field}-{json.dumps(value)[:24]}", path, {**base, field: value}, status, param))
        for field, literal, param in RAW_VALUES:
            rows.append(Case(f"{tag}-raw-{field}-{literal[:12]}", *_raw_with(path, base, field, literal), 400, param))
    return rows


PROMPT_ROWS = [
    Case("prompt-missing", COMPLETIONS, {"model": "fd-toy"}, 400, "prompt"),
    Case("prompt-null", COMPLETIONS, completion(prompt=None), 400, "prompt"),
    Case("prompt-number", COMPLETIONS, completion(prompt=5), 400, "prompt"),
    Case("prompt-object", COMPLETIONS, completion(prompt={"text": "x"}), 400, "prompt"),
    Case("prompt-empty-string", COMPLETIONS, completion(prompt=""), 400, "prompt"),
    Case("prompt-whitespace", COMPLETIONS, completion(prompt=" \n\t "), 400, "prompt"),
    Case("prompt-empty-list", COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    Case("prompt-empty-id-list", COMPLETIONS, completion(prompt=[[]]), 400, "prompt[0]"),
    Case("prompt-id-out-of-vocab", COMPLETIONS, completion(prompt=[256, 999999]), 400, "prompt[1]"),
    Case("prompt-negative-id", COMPLETIONS, completion(prompt=[-1]), 400, "prompt[0]"),
    Case("prompt-bool-ids", COMPLETIONS, completion(prompt=[True, False]), 400, "prompt[0]"),
    Case("prompt-mixed-kinds", COMPLETIONS, completion(prompt=[1, "a"]), 400, "prompt[1]"),
    Case("prompt-strings-with-number", COMPLETIONS, completion(prompt=["a", 5]), 400, "prompt[1]"),
    Case("prompt-strings-empty-element", COMPLETIONS, completion(prompt=["", "a"]), 400, "prompt[0]"),
    Case("prompt-id-lists-bad-id", COMPLETIONS, completion(prompt=[[1, 2], [3, 99999]]), 400, "prompt[1][1]"),
    Case("prompt-id-lists-nested", COMPLETIONS, completion(prompt=[[[1]]]), 400, "prompt[0][0]"),
    Case("prompt-list-of-objects", COMPLETIONS, completion(prompt=[{}]), 400, "prompt[0]"),
    Case("prompt-longer-than-max-model-len", COMPLETIONS, completion(prompt="x" * MAX_MODEL_LEN), 400, "prompt"),
    Case("prompt-list-one-too-long", COMPLETIONS, completion(prompt=["ok", "x" * MAX_MODEL_LEN]), 400, "prompt[1]"),
    Case("prompt-plus-max-tokens-exactly-max-model-len", COMPLETIONS,
         completion(prompt=[256, 65], max_tokens=MAX_MODEL_LEN - 2, min_tokens=0, stop=["\n", " "]), 200),
    Case("prompt-choices-over-limit", COMPLETIONS, completion(prompt=["a"] * 65, n=2), 400, "n"),
    Case("prompt-logprobs-over-5", COMPLETIONS, completion(logprobs=6), 400, "logprobs"),
    Case("prompt-logprobs-bool", COMPLETIONS, completion(logprobs=True), 400, "logprobs"),
    Case("prompt-suffix", COMPLETIONS, completion(suffix="x"), 400, "suffix"),
    Case("prompt-surrogate", *_raw_with(COMPLETIONS, completion(), "prompt", f'"Hi{SURROGATE}"'), 400, "prompt"),
    Case("prompt-surrogate-in-list", *_raw_with(COMPLETIONS, completion(), "prompt", f'["ok", "{SURROGATE}"]'),
         400, "prompt[1]"),
    Case("prompt-surrogate-pair-ok", *_raw_with(COMPLETIONS, completion(), "prompt", '"Hi \\ud83d\\ude00"'), 200),
    Case("prompt-huge-id", *_raw_with(COMPLETIONS, completion(), "prompt", f"[{HUGE_INT}]"), 400, "prompt[0]"),
    Case("prompt-nul-char-ok", COMPLETIONS, completion(prompt="a\u0000b"), 200),
    Case("prompt-bootstrap-fields-ignored-on-mixed", COMPLETIONS,
         completion(bootstrap_host="127.0.0.1", bootstrap_port=9, bootstrap_room=2 ** 64 - 1), 200),
    Case("prompt-all-nulls", COMPLETIONS, completion(temperature=None, top_p=None, n=None, max_tokens=None,
                                                     stop=None, seed=None, stream=None, user=None, model=None), 200),
]


def _message(**fields) -> dict:
    return chat(messages=[fields])


CHAT_ROWS = [
    Case("chat-no-messages", CHAT, chat(messages=[]), 400, "messages"),
    Case("chat-messages-string", CHAT, chat(messages="hi"), 400, "messages"),
    Case("chat-message-not-object", CHAT, chat(messages=["hi"]), 400, "messages[0]"),
    Case("chat-bad-role", CHAT, _message(role="robot", content="x"), 400, "messages[0].role"),
    Case("chat-tool-role", CHAT, _message(role="tool", content="x"), 400, "messages[0].role"),
    Case("chat-missing-role", CHAT, _message(content="x"), 400, "messages[0].role"),
    Case("chat-missing-content", CHAT, _message(role="user"), 400, "messages[0].content"),
    Case("chat-content-number", CHAT, _message(role="user", content=5), 400, "messages[0].content"),
    Case("chat-image-part", CHAT, _message(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}]),
         400, "messages[0].content[0].type"),
    Case("chat-part-without-text", CHAT, _message(role="user", content=[{"type": "text"}]), 400,
         "messages[0].content[0].text"),
    Case("chat-part-not-object", CHAT, _message(role="user", content=["hi"]), 400, "messages[0].content[0]"),
    Case("chat-name-number", CHAT, _message(role="user", content="x", name=5), 400, "messages[0].name"),
    Case("chat-unknown-message-field", CHAT, _message(role="user", content="x", tool_calls=[]), 400,
         "messages[0].tool_calls"),
    Case("chat-whitespace-user", CHAT, _message(role="user", content="  "), 400, "messages"),
    Case("chat-only-system", CHAT, _message(role="system", content="be brief"), 400, "messages"),
    Case("chat-both-token-limits", CHAT, chat(max_completion_tokens=3), 400, "max_tokens"),
    Case("chat-max-completion-tokens-zero", CHAT, chat(max_tokens=None, max_completion_tokens=0), 400,
         "max_completion_tokens"),
    Case("chat-tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    Case("chat-tool-choice-required", CHAT, chat(tool_choice="required"), 400, "tool_choice"),
    Case("chat-response-format-json", CHAT, chat(response_format={"type": "json_object"}), 400, "response_format"),
    Case("chat-top-logprobs-over-20", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    Case("chat-logprobs-int", CHAT, chat(logprobs=1), 400, "logprobs"),
    Case("chat-top-logprobs", CHAT, chat(top_logprobs=3), 400, "top_logprobs"),
    Case("chat-add-generation-prompt-string", CHAT, chat(add_generation_prompt="x"), 400, "add_generation_prompt"),
    Case("chat-continue-after-user", CHAT, chat(continue_final_message=True), 400, "continue_final_message"),
    Case("chat-continue-and-generation-prompt", CHAT,
         chat(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "He"}],
              continue_final_message=True, add_generation_prompt=True), 400, "continue_final_message"),
    Case("chat-suffix-unknown", CHAT, chat(suffix="x"), 400, "suffix"),
    Case("chat-prompt-too-long", CHAT, _message(role="user", content="x" * MAX_MODEL_LEN), 400, "messages"),
    Case("chat-content-surrogate", *_raw_with(CHAT, chat(), "messages",
                                              f'[{{"role": "user", "content": "a{SURROGATE}"}}]'),
         400, "messages[0].content"),
    Case("chat-part-surrogate", *_raw_with(CHAT, chat(), "messages",
                                           f'[{{"role": "user", "content": [{{"type": "text", '
                                           f'"text": "{SURROGATE}"}}]}}]'), 400, "messages[0].content[0].text"),
    Case("chat-name-surrogate", *_raw_with(CHAT, chat(), "messages",
                                           f'[{{"role": "user", "content": "x", "name": "{SURROGATE}"}}]'),
         400, "messages[0].name"),
    Case("chat-key-surrogate", *_raw_with(CHAT, chat(), "messages", f'[{{"role": "user", "{SURROGATE}": 1}}]'),
         400, "messages[0]"),
    Case("chat-template-syntax-is-data", CHAT, _message(role="user", content="{{ 7 * 7 }} {% for %}"), 200),
    Case("chat-developer-and-parts", CHAT,
         chat(messages=[{"role": "developer", "content": "Be brief."},
                        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Hi"}]}]), 200),
    Case("chat-tool-choice-none-ok", CHAT, chat(tool_choice="none", tools=None, response_format={"type": "text"}),
         200),
]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


BODY_ROWS = [
    Case("json-malformed", COMPLETIONS, "{not json", 400),
    Case("json-empty-body", COMPLETIONS, "", 400),
    Case("json-null", COMPLETIONS, "null", 400),
    Case("json-array", COMPLETIONS, "[1, 2]", 400),
    Case("json-string", COMPLETIONS, '"hello"', 400),
    Case("json-number", COMPLETIONS, "123", 400),
    Case("json-trailing-garbage", COMPLETIONS, json.dumps(completion()) + " x", 400),
    Case("json-truncated", COMPLETIONS, json.dumps(completion())[:-5], 400),
    Case("json-bom", COMPLETIONS, "\ufeff" + json.dumps(completion()), 400),
    Case("json-nan", COMPLETIONS, '{"model": "fd-toy", "prompt": "x", "temperature": NaN}', 400),
    Case("json-infinity", COMPLETIONS, '{"model": "fd-toy", "prompt": "x", "temperature": Infinity}', 400),
    Case("json-single-quotes", COMPLETIONS, "{'model': 'fd-toy'}", 400),
    Case("json-comment", COMPLETIONS, '{"model": "fd-toy", /* c */ "prompt": "x"}', 400),
    Case("json-invalid-utf8", COMPLETIONS, b'{"model": "fd-toy", "prompt": "\xff\xfe"}', 400),
    Case("json-overlong-utf8", COMPLETIONS, b'{"model": "fd-toy", "prompt": "\xc0\xaf"}', 400),
    Case("json-deep-30000", COMPLETIONS, '{"model": "fd-toy", "prompt": ' + _deep(30000) + "}", 400),
    Case("json-deep-2000-top", COMPLETIONS, _deep(2000), 400),
    Case("json-deep-objects", COMPLETIONS, '{"a": ' * 3000 + "1" + "}" * 3000, 400),
    Case("json-deep-1000-prompt", COMPLETIONS, '{"model": "fd-toy", "prompt": ' + _deep(1000) + "}", 400,
         "prompt[0][0]"),
    Case("json-deep-1000-logit-bias", COMPLETIONS,
         '{"model": "fd-toy", "prompt": "x", "logit_bias": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}", 400,
         "logit_bias"),
    Case("json-deep-chat-content", CHAT,
         '{"model": "fd-toy", "messages": [{"role": "user", "content": ' + _deep(1000) + "}]}", 400,
         "messages[0].content[0]"),
    Case("json-deep-with-surrogate", COMPLETIONS,
         f'{{"model": "fd-toy", "user": "{SURROGATE}", "prompt": ' + _deep(5000) + "}", 400),
    Case("json-duplicate-keys-last-wins", COMPLETIONS, '{"model": "fd-toy", "prompt": 5, "prompt": "Hi", '
                                                       '"max_tokens": 2}', 200),
    Case("body-too-large", COMPLETIONS, completion(prompt="x" * MAX_BODY), 413),
    Case("body-too-large-chat", CHAT, chat(messages=[{"role": "user", "content": "x" * MAX_BODY}]), 413),
    Case("model-unknown", COMPLETIONS, completion(model="gpt-4"), 404, "model"),
    Case("tokenize-neither", "/tokenize", {"model": "fd-toy"}, 400, "prompt"),
    Case("tokenize-both", "/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, 400,
         "prompt"),
    Case("tokenize-prompt-number", "/tokenize", {"prompt": 5}, 400, "prompt"),
    Case("tokenize-surrogate", *_raw_with("/tokenize", {}, "prompt", f'"{SURROGATE}"'), 400, "prompt"),
    Case("tokenize-unknown-model", "/tokenize", {"model": "x", "prompt": "a"}, 404, "model"),
    Case("detokenize-out-of-vocab", "/detokenize", {"tokens": [65, 999]}, 400, "tokens[1]"),
    Case("detokenize-negative", "/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
    Case("detokenize-not-list", "/detokenize", {"tokens": "AB"}, 400, "tokens"),
    Case("detokenize-huge", *_raw_with("/detokenize", {}, "tokens", f"[{HUGE_INT}]"), 400, "tokens[0]"),
]

CASES = _shared_rows() + PROMPT_ROWS + CHAT_ROWS + BODY_ROWS
