"""The self-check a Kunlun P800 operator runs first, to attach to a report (docs/kunlun3.md, "On a P800").

    python -m fastdeploy.tools.kunlun_selfcheck [--json FILE] [--cases N] [--model DIR [--mtp-model DIR]]

Four parts, each a table and a one-line verdict: the environment (Paddle build, XPU SDK, devices, clusters); op
parity of the Kunlun3 kernels against the C++ CPU path on random states per op and cluster count (OPS §8 C1); the
hardware probes H1-H5 (XPU3_KERNEL_MODEL §14); PD + MTP end to end on fd-tiny with the runner's state on the device,
compared with the single-instance CPU path (PD_MTP_FLOW §10). With `--model DIR` (a checkpoint with an MTP module,
e.g. ERNIE-4.5-21B-A3B; `--mtp-model DIR` when its MTP weights live elsewhere) a fifth part runs the same PD + MTP
comparison on that model, K = 1, and reports how many drafts were accepted. Without a device (or without a vendor
build of the extension) it says so, runs the emulator equivalents (the models then compute on the CPU) and exits 0
with that fact in its last line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field

import paddle

from fastdeploy.entrypoints.openai.serve_args import add_precision_flags
from fastdeploy.model_executor.ops import _kl3_pybind
from fastdeploy.tools import op_parity

SDK_VARIABLES = ("CLANG_PATH", "XDNN_INC_DIR", "XDNN_LIB_DIR", "XRE_INC_DIR", "XRE_LIB_DIR", "XPU_INC_DIR",
                 "XPU_LIB_DIR")
PROMPTS = ("On Monday, Judy", "The little dog", "Once upon a time")


@dataclass(slots=True)
class Part:
    name: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    ok: bool | None = None  # None: skipped
    verdict: str = ""


@dataclass(slots=True)
class Target:
    """Where the Kunlun3 kernels run in this check."""

    on_device: bool
    backend: str           # ops backend name ("xpu3" or "xpu3-emulator")
    place: object          # paddle place of the device tensors
    clusters: list[int]    # cluster counts the parity part launches with
    reason: str            # why there is no device, or "" on a device


def find_target() -> Target:
    device_count = paddle.device.xpu.device_count() if paddle.is_compiled_with_xpu() else 0
    if device_count and _kl3_pybind.VENDOR_BUILD:
        max_clusters = max([c for c in _kl3_pybind.device_clusters()[:1] if c > 0] or [12])
        return Target(True, "xpu3", paddle.XPUPlace(0), sorted({1, 2, max_clusters}), "")
    reason = ("no Kunlun device" if not device_count
              else "Kunlun device present, but the extension was built without the vendor toolchain")
    return Target(False, "xpu3-emulator", paddle.CPUPlace(), [1, 2, 12], reason)


def check_environment(target: Target) -> Part:
    part = Part("environment", ["item", "value"])
    clusters = _kl3_pybind.device_clusters()
    part.rows = [
        ["paddle", f"{paddle.__version__} (compiled with XPU: {paddle.is_compiled_with_xpu()})"],
        ["op extension", "vendor build (XTDK kernels)" if _kl3_pybind.VENDOR_BUILD else "host build (emulated kernels)"],
        ["XPU SDK", ", ".join(f"{v}={os.environ[v]}" for v in SDK_VARIABLES if os.environ.get(v)) or "not set"],
        ["devices", str(paddle.device.xpu.device_count() if paddle.is_compiled_with_xpu() else 0)],
        ["clusters per device", ", ".join(map(str, clusters)) or "-"],
    ]
    part.ok = True
    part.verdict = ("Kunlun device found: the kernels run on XPU:0" if target.on_device
                    else f"{target.reason}: running the emulator equivalents")
    return part


def check_parity(target: Target, cases: int) -> Part:
    part = Part("op parity vs CPU path", ["op", "backend", "clusters", "cases", "result"])
    generators = op_parity.load_generators()
    if generators is None:
        part.verdict = f"skipped: needs a source checkout ({op_parity.TESTS_DIR / 'reference'} not found)"
        return part
    rows = op_parity.check_parity(generators, target.backend, target.clusters, cases, target.place)
    part.rows = [[r.op, r.backend, str(r.ncluster), str(r.cases),
                  "identical" if not r.mismatches else f"{r.mismatches} differ; first: {r.first_mismatch}"]
                 for r in rows]
    part.ok = all(r.mismatches == 0 for r in rows)
    total = sum(r.cases for r in rows)
    part.verdict = (f"all {total} random states identical on {target.backend}" if part.ok
                    else f"MISMATCH on {target.backend}: see the rows that differ")
    return part


def _probe_rows(target: Target) -> list[dict]:
    if not target.on_device:
        return _kl3_pybind.run_probes()
    rows = _kl3_pybind.run_probes(["H1", "H2", "H3", "H4"])
    # H5 may hang the chip's stream: run it in a child process that can be ended.
    code = ("import json; from fastdeploy.model_executor.ops import _kl3_pybind as k; "
            "print(json.dumps(k.run_probes(['H5'])))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as exc:
        rows.append({"id": "H5", "status": "error", "observation": f"child process failed: {exc!r}",
                     "emulator_assumes": "", "question": "", "matches_emulator": False})
    return rows


def check_probes(target: Target) -> Part:
    part = Part("hardware probes (XPU3_KERNEL_MODEL §14)", ["probe", "status", "observation", "emulator assumes"])
    results = _probe_rows(target)
    part.rows = [[r["id"], r["status"], r["observation"], r["emulator_assumes"]] for r in results]
    if target.on_device:
        part.ok = all(r["status"] != "error" for r in results)
        differ = [r["id"] for r in results if not r["matches_emulator"]]
        part.verdict = ("observed on the chip; differs from the emulator's assumption: "
                        + (", ".join(differ) or "none") + " (record in docs/kunlun3.md)")
    else:
        part.ok = all(r["matches_emulator"] for r in results)
        part.verdict = ("emulator: every probe shows the emulator's assumed outcome" if part.ok
                        else "emulator: a probe did not show the assumed outcome")
    return part


def check_pd_mtp(target: Target) -> Part:
    from fastdeploy import LLM, SamplingParams

    part = Part("PD + MTP end to end (fd-tiny)", ["prompt", "single, CPU path", f"PD, {target.backend}", "result"])
    params = SamplingParams(temperature=0, max_tokens=12)
    mtp = {"method": "mtp", "num_speculative_tokens": 1}
    reference = LLM(model="fd-tiny", speculative_config=mtp).generate(list(PROMPTS), params)
    pd = LLM(model="fd-tiny", speculative_config=mtp, splitwise=True,
             ops_backend=target.backend).generate(list(PROMPTS), params)
    same = []
    for prompt, ref, out in zip(PROMPTS, reference, pd):
        equal = ref.outputs.token_ids == out.outputs.token_ids and ref.outputs.finish_reason == out.outputs.finish_reason
        same.append(equal)
        part.rows.append([prompt, f"{len(ref.outputs.token_ids)} tokens, {ref.outputs.finish_reason}",
                          f"{len(out.outputs.token_ids)} tokens, {out.outputs.finish_reason}",
                          "identical" if equal else "DIFFERENT"])
    part.ok = all(same)
    where = "on the device" if target.on_device else "on the host (emulated kernels)"
    part.verdict = (f"PD + MTP with the state {where} equals the single-instance CPU path" if part.ok
                    else "PD + MTP output differs from the single-instance CPU path")
    return part


def check_checkpoint_pd_mtp(target: Target, model: str, mtp_model: str | None = None, dtype: str = "float32",
                            quantization: str | None = None, kv_cache_dtype: str = "auto") -> Part:
    """PD + MTP (K = 1) on a real checkpoint against the single-instance CPU path, as check_pd_mtp on fd-tiny, in
    the precision given (docs/models.md "Precision")."""
    from fastdeploy import LLM, SamplingParams

    where = "on the device" if target.on_device else "on the CPU (no Kunlun device: the model computes on the host)"
    precision = dict(dtype=dtype, quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    part = Part(f"PD + MTP end to end ({model}, {dtype}{', ' + quantization if quantization else ''})",
                ["prompt", "single, CPU path", f"PD, {target.backend}", "drafts accepted", "result"])
    params = SamplingParams(temperature=0, max_tokens=12)
    mtp = {"method": "mtp", "num_speculative_tokens": 1, **({"model": mtp_model} if mtp_model else {})}
    try:
        reference = LLM(model=model, speculative_config=mtp, **precision).generate(list(PROMPTS), params,
                                                                                    use_tqdm=False)
        pd = LLM(model=model, speculative_config=mtp, splitwise=True, ops_backend=target.backend,
                 **precision).generate(list(PROMPTS), params, use_tqdm=False)
    except ValueError as error:   # a checkpoint that cannot serve (no MTP weights, a bad file): its one line
        part.ok, part.verdict = False, f"the checkpoint cannot run PD + MTP: {error}"
        return part
    same = []
    for prompt, ref, out in zip(PROMPTS, reference, pd):
        equal = (ref.outputs.token_ids == out.outputs.token_ids
                 and ref.outputs.finish_reason == out.outputs.finish_reason)
        same.append(equal)
        part.rows.append([prompt, f"{len(ref.outputs.token_ids)} tokens, {ref.outputs.finish_reason}",
                          f"{len(out.outputs.token_ids)} tokens, {out.outputs.finish_reason}",
                          f"{out.metrics.num_accepted_drafts}/{out.metrics.num_draft_tokens}",
                          "identical" if equal else "DIFFERENT"])
    part.ok = all(same)
    part.verdict = (f"PD + MTP with the checkpoint's MTP module, {where}, equals the single-instance CPU path"
                    if part.ok else f"PD + MTP output ({where}) differs from the single-instance CPU path")
    return part


def render(part: Part) -> str:
    widths = [max(len(str(x)) for x in [c] + [row[i] for row in part.rows]) for i, c in enumerate(part.columns)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    status = "SKIP" if part.ok is None else "PASS" if part.ok else "FAIL"
    body = [line(part.columns), line("-" * w for w in widths)] + [line(row) for row in part.rows]
    return "\n".join([f"== {part.name}"] + body + [f"verdict [{status}]: {part.verdict}", ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastdeploy.tools.kunlun_selfcheck",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--cases", type=int, default=8,
                        help="random states per op and cluster count in the parity part (default: %(default)s)")
    parser.add_argument("--model", metavar="DIR", help="also run PD + MTP on this checkpoint directory (one with an "
                                                       "MTP module, e.g. ERNIE-4.5-21B-A3B)")
    parser.add_argument("--mtp-model", metavar="DIR", help="the checkpoint's MTP weights, when not in --model "
                                                           "(FastDeploy's speculative config 'model')")
    add_precision_flags(parser)
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error("argument --cases: expected a positive integer")
    if args.mtp_model and not args.model:
        parser.error("argument --mtp-model: needs --model")
    for flag, path in (("--model", args.model), ("--mtp-model", args.mtp_model)):
        if path and not os.path.isdir(path):
            parser.error(f"argument {flag}: {path!r} is not a directory")
    target = find_target()
    checks = [("environment", lambda: check_environment(target)),
              ("op parity", lambda: check_parity(target, args.cases)),
              ("probes", lambda: check_probes(target)), ("PD + MTP", lambda: check_pd_mtp(target))]
    if args.model:
        checks.append(("PD + MTP, checkpoint", lambda: check_checkpoint_pd_mtp(
            target, args.model, args.mtp_model, args.dtype, args.quantization, args.kv_cache_dtype)))
    parts = []
    for i, (label, check) in enumerate(checks, 1):
        print(f"[{i}/{len(checks)}] {label} ...", file=sys.stderr, flush=True)
        parts.append(check())
        print(render(parts[-1]))
    failed = [p.name for p in parts if p.ok is False]
    if target.on_device:
        last = "VERDICT: Kunlun P800 check " + ("passed" if not failed else "FAILED: " + ", ".join(failed))
    else:
        last = (f"VERDICT: {target.reason}; nothing ran on Kunlun hardware. Emulator equivalents "
                + ("passed" if not failed else "FAILED: " + ", ".join(failed)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"on_device": target.on_device, "backend": target.backend, "reason": target.reason,
                       "parts": [asdict(p) for p in parts], "verdict": last}, f, indent=2)
    print(last)
    return 1 if failed and target.on_device else 0


if __name__ == "__main__":
    sys.exit(main())
