"""The API server's command line (SERVICES §2): `fastdeploy serve` runs the same server; `--help` shows every
default; unknown or contradictory flags exit with status 2 and one line, for both `python -m ...api_server` and
`fastdeploy serve`."""
from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import sys

import httpx
import pytest
from openai import NotFoundError, OpenAI

from fastdeploy import LLM, SamplingParams

from fastdeploy.entrypoints.openai.serve_args import parse_args
from tests.services import launcher
from tests.services.launcher import API_SERVER, REPO

COMMANDS = {"module": [sys.executable, "-m", API_SERVER],
            "cli": [sys.executable, "-m", "fastdeploy.entrypoints.cli", "serve"]}
BAD_FLAGS = [("unknown_flag", ["--bogus"]), ("pd_port_without_pd_role", ["--pd-comm-port", "9100"]),
             ("bad_role", ["--splitwise-role", "both"]),
             ("speculative_not_json", ["--speculative-config", "{mtp"]),
             ("speculative_unknown_method", ["--speculative-config", '{"method": "eagle"}']),
             ("port_out_of_range", ["--port", "70000"]), ("zero_concurrency", ["--max-concurrency", "0"]),
             ("bad_max_model_len", ["--max-model-len", "1"]),
             ("ssl_key_without_cert", ["--ssl-keyfile", "/etc/hostname"])]
# the OpenAI front end's contradictions, checked in this process (the same parse_args; no interpreter each)
OPENAI_BAD_FLAGS = [
    ("ssl_files_missing", ["--ssl-keyfile", "/nonexistent.key", "--ssl-certfile", "/nonexistent.pem"]),
    ("chat_template_missing", ["--chat-template", "/nonexistent.jinja"]),
    ("chat_template_not_jinja", ["--chat-template", "UNCLOSED"]),
    ("allowed_origins_not_a_list", ["--allowed-origins", "[1, 2]"]),
    ("credentials_without_origins", ["--allow-credentials"]),
    ("empty_served_model_name", ["--served-model-name", " "]),
]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)


# every case through the module; two through `fastdeploy serve` (the same checks; each run costs an interpreter)
CASES = [("module", *case) for case in BAD_FLAGS] + [("cli", *case) for case in BAD_FLAGS[:2]]


@pytest.mark.parametrize("command,case,flags", CASES, ids=[f"{c}-{n}" for c, n, _ in CASES])
def test_bad_flags_exit_2_with_one_line(command, case, flags):
    result = _run(COMMANDS[command] + flags)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "error:" in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case,flags", OPENAI_BAD_FLAGS, ids=[c for c, _ in OPENAI_BAD_FLAGS])
def test_openai_flag_contradictions_exit_2_with_one_line(case, flags, tmp_path, capsys):
    if "UNCLOSED" in flags:
        (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m.content }\n")
        flags = [str(tmp_path / "t.jinja") if f == "UNCLOSED" else f for f in flags]
    with pytest.raises(SystemExit) as exited:
        parse_args(flags)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err, err


def test_help_shows_every_default():
    """Every option of `--help` says its default once (argparse's defaults formatter, or the help's own words)."""
    text = _run(COMMANDS["module"] + ["--help"]).stdout
    options = re.findall(r"^  (--[a-z-]+)", text, flags=re.M)
    assert len(options) >= 20
    blocks = re.split(r"\n(?=  --)", text.split("options:")[1])
    missing = [b.split()[0] for b in blocks if b.strip().startswith("--") and "default" not in b]
    assert not missing, missing
    twice = [b.split()[0] for b in blocks if b.strip().startswith("--") and b.count("default:") > 1]
    assert not twice, twice


def test_fastdeploy_serve_runs_the_api_server():
    """`fastdeploy serve ...` serves the same API (ready, the model listed) and exits 0 on SIGTERM."""
    server = launcher.start(module="fastdeploy.entrypoints.cli", subcommand="serve")
    try:
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["fd-toy"]
    finally:
        status = launcher.stop(server)
    assert status == 0, server.log()[-3000:]


# ---- the OpenAI front end's flags, on one TLS server (docs/serving.md, "Flags") ----

TEMPLATE = """{% for m in messages %}
[{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}] {{ m.content }}
{% endfor %}
{% if add_generation_prompt %}[assistant] {% endif %}"""
ORIGIN = "https://ok.example"


def _self_signed(directory) -> tuple[str, str]:
    """A throwaway key and certificate for 127.0.0.1 (openssl CLI)."""
    key, cert = str(directory / "key.pem"), str(directory / "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return key, cert


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (needed to make a test certificate)")
    directory = tmp_path_factory.mktemp("flags")
    key, cert = _self_signed(directory)
    (directory / "chat.jinja").write_text(TEMPLATE)
    server = launcher.start("--served-model-name", "toy-a", "toy-b", "--chat-template", str(directory / "chat.jinja"),
                            "--allowed-origins", ORIGIN, "--ssl-keyfile", key, "--ssl-certfile", cert,
                            wait_ready=False, log_dir=directory)
    http = httpx.Client(base_url=f"https://127.0.0.1:{server.port}", timeout=60,
                        verify=ssl.create_default_context(cafile=cert))
    try:
        server.wait_until(lambda s: _healthy(http), "the TLS server ready", timeout_s=launcher.START_TIMEOUT_S)
        yield server, http
    finally:
        http.close()
        launcher.stop(server)
        print(f"---- TLS server log ----\n{server.log()[-4000:]}")


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


def test_tls_serves_https_only(tls_server):
    """--ssl-keyfile/--ssl-certfile: the API answers over HTTPS with that certificate; plain HTTP gets no API."""
    server, http = tls_server
    assert http.get("/v1/models").status_code == 200
    try:
        plain = httpx.get(f"http://127.0.0.1:{server.port}/v1/models", timeout=10).status_code
    except httpx.HTTPError:
        plain = None
    assert plain != 200


def test_served_model_names_first_reported_any_accepted(tls_server):
    """--served-model-name toy-a toy-b: both listed, either accepted in `model`, the first reported; the
    embedded model's own name is not served."""
    server, http = tls_server
    client = OpenAI(base_url=f"https://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, http_client=http)
    assert [m.id for m in client.models.list().data] == ["toy-a", "toy-b"]
    got = client.completions.create(model="toy-b", prompt="Hello", max_tokens=2)
    assert got.model == "toy-a"
    with pytest.raises(NotFoundError):
        client.completions.create(model="fd-toy", prompt="Hello", max_tokens=2)


def test_chat_template_file_renders_as_huggingface_does(tls_server):
    """--chat-template FILE: rendered with trim_blocks and lstrip_blocks (the expected text is written out), and
    the completion equals the in-process LLM on that text."""
    server, http = tls_server
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "name": "ann", "content": "Hi!"}]
    want_text = "[system] Be brief.\n[user:ann] Hi!\n[assistant] "
    tokens = http.post("/tokenize", json={"messages": messages, "add_special_tokens": False}).json()["tokens"]
    assert bytes(tokens).decode() == want_text
    want = LLM(model="fd-toy").generate(want_text, SamplingParams(max_tokens=6), use_tqdm=False)[0].outputs.text
    client = OpenAI(base_url=f"https://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, http_client=http)
    got = client.chat.completions.create(model="toy-a", messages=messages, max_tokens=6)
    assert got.choices[0].message.content == want


def test_cors_allows_only_the_given_origin(tls_server):
    """--allowed-origins: a preflight from that origin is allowed and answers carry its CORS header; another
    origin gets no CORS permission."""
    _, http = tls_server
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed = http.options("/v1/completions", headers={"Origin": ORIGIN, **preflight})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    simple = http.get("/v1/models", headers={"Origin": ORIGIN})
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    other = http.options("/v1/completions", headers={"Origin": "https://evil.example", **preflight})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert "access-control-allow-origin" not in http.get("/v1/models", headers={"Origin": "https://evil.example"}
                                                         ).headers


# ---- FastDeploy's launch flags (docs/serving.md "FastDeploy's flags") ----

# FastDeploy's ERNIE-4.5-0.3B quick start line (docs/get_started/quick_start.md) with the flags its XPU table adds
# (docs/usage/kunlunxin_xpu_deployment.md, 32K BF16 row): the model path swapped, --host and --port given by the
# launcher, the metrics port a free one. (Its WINT8 row's --quantization needs a checkpoint directory: the embedded
# models are float32 only, tests/services/test_api_precision.py.)
ERNIE_FLAGS = ["--engine-worker-queue-port", "8182", "--max-model-len", "32768", "--max-num-seqs", "32",
               "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--load-choices", "default",
               "--cache-queue-port", "8183", "--enable-chunked-prefill", "--trust-remote-code"]


def test_fastdeploy_ernie_command_line_serves(tmp_path):
    """FastDeploy's published ERNIE command line starts a server here and it answers; each ignored flag is one
    note at start."""
    server = launcher.start(*ERNIE_FLAGS, "--metrics-port", str(launcher.free_port()), log_dir=tmp_path)
    try:
        reply = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"model": "fd-toy", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        launcher.stop(server)
    log = server.log()
    for flag in ("--gpu-memory-utilization", "--engine-worker-queue-port", "--load-choices", "--trust-remote-code"):
        assert log.count(f"note: {flag} ignored") == 1, log[-3000:]


@pytest.mark.parametrize("flags,why", [
    (["--tensor-parallel-size", "2"], "one device per instance"),
    (["--data-parallel-size", "2"], "behind the router"),
    (["--reasoning-parser", "ernie-45"], "no such parser"),
    (["--tool-call-parser", "ernie-x1"], "no such parser"),
    (["--scheduler-name", "splitwise"], "only the local scheduler"),
    (["--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
])
def test_fastdeploy_flags_that_cannot_apply_are_refused_with_one_line(flags, why, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(flags)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and why in err, err


def test_fastdeploy_serve_pd_refuses_tensor_parallel_before_starting(capsys):
    from fastdeploy.entrypoints.cli import main
    assert main(["serve", "--pd", "--tensor-parallel-size", "4"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "one device per instance" in err, err


@pytest.mark.parametrize("role,flags", [
    ("prefill", ["--cache-transfer-protocol", "rdma,ipc", "--rdma-comm-ports", "7671", "--pd-comm-port", "2334"]),
    ("decode", ["--cache-transfer-protocol", "ipc", "--innode-prefill-ports", "4200"]),
])
def test_fastdeploy_pd_command_lines_parse_with_notes(role, flags, capsys):
    """FastDeploy's PD instance lines (docs/features/disaggregated.md: ports, role, protocol, router): accepted, its
    transfer protocols taken as zmq, each ignored flag or rewritten value one note."""
    args = parse_args(["--model", "fd-toy", "--splitwise-role", role, "--tensor-parallel-size", "1",
                       "--engine-worker-queue-port", "8182", "--cache-queue-port", "8183",
                       "--num-gpu-blocks-override", "200", "--router", "127.0.0.1:30000", *flags])
    assert (args.splitwise_role, args.cache_transfer_protocol, args.num_kv_blocks) == (role, "zmq", 200)
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 4 and all(": note: --" in line for line in notes), notes
