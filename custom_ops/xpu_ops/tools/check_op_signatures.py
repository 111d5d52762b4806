#!/usr/bin/env python3
"""Checks every face of every state op against the one signature table (fastdeploy/model_executor/ops/op_table.py,
docs/design.md §1): plugin.h, the op layer's argument specs (mtp_calls.cc), the Paddle registrations with their
in-place maps (op_signatures.h, ops/mtp/*.cc), their Python bindings (ops/mtp/python_calls.cc) and the pybind
module. The Python entry reads the table directly.

setup.py runs `check()` before compiling, so a drift fails the build with the face, op and argument.
Usage: check_op_signatures.py   (exit 1 and one line per problem on drift)
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

XPU_OPS = Path(__file__).resolve().parents[1]
ROOT = XPU_OPS.parents[1]
SRC = XPU_OPS / "src"
TABLE = ROOT / "fastdeploy" / "model_executor" / "ops" / "op_table.py"

C_TYPES = {"bool": "bool", "int32_t": "int32", "int64_t": "int64"}
SPEC_DTYPES = {"kB": "bool", "kI32": "int32", "kI64": "int64"}
SPEC_FORMS = {"kVec": "vector", "kFlag": "flag", "kMat": "matrix", "Form::kTensor3": "tensor3"}


def load_table():
    spec = importlib.util.spec_from_file_location("fd_op_table", TABLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building the classes
    spec.loader.exec_module(module)
    return module


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def check_plugin_h(op, problems, src):
    text = _strip_comments((src / "plugin" / "include" / "xpu" / "plugin.h").read_text())
    m = re.search(rf"\bint {op.name}\(kl3::Context\* ctx,(.*?)\);", text, re.S)
    if not m:
        return problems.append(f"plugin.h: {op.name}: no declaration")
    params = [p.split() for p in m.group(1).replace("*", " * ").split(",")]
    pointers = [(p[0] == "const", p[1 if p[0] == "const" else 0], p[-1]) for p in params if "*" in p]
    pointers = [p for p in pointers if not (op.returns_msg and p[2] == "msg")]
    if [p[2] for p in pointers] != list(op.arg_names):
        return problems.append(f"plugin.h: {op.name}: tensors {[p[2] for p in pointers]} != {list(op.arg_names)}")
    for (const, ctype, name), arg in zip(pointers, op.args):
        if C_TYPES.get(ctype) != arg.dtype or const == arg.written:
            problems.append(f"plugin.h: {op.name}: argument '{name}': {'const ' if const else ''}{ctype}* does not "
                            f"match {arg.dtype}, {'written' if arg.written else 'read-only'}")
    scalars = [p[-1] for p in params if "*" not in p]
    attrs = [name for name, _ in op.attrs]
    if scalars[len(scalars) - len(attrs):] != attrs:
        problems.append(f"plugin.h: {op.name}: trailing attributes {scalars[-len(attrs):] if attrs else []} != {attrs}")


def check_op_layer(op, problems, src):
    text = (src / "ops" / "common" / "mtp_calls.cc").read_text()
    m = re.search(rf"\nvoid {op.name}\(.*?static const ArgSpec specs\[\] = \{{(.*?)\}};", text, re.S)
    if not m:
        return problems.append(f"mtp_calls.cc: {op.name}: no ArgSpec table")
    specs = re.findall(r"\{\"(\w+)\", (\w+), ([\w:]+), (\w+), (\w+)(, true)?\}", m.group(1))
    got = [(n, SPEC_DTYPES.get(d), SPEC_FORMS.get(f), w == "kHost", a == "kW", bool(o)) for n, d, f, w, a, o in specs]
    want = [(a.name, a.dtype, a.form, a.host, a.written, a.optional) for a in op.args]
    if got != want:
        for g, w in zip(got + [None] * len(want), want + [None] * len(got)):
            if g != w:
                return problems.append(f"mtp_calls.cc: {op.name}: spec {g} != table {w}")


def _quoted(text: str) -> list[str]:
    return re.findall(r"\"([^\"]+)\"", text)


def check_registrations(op, table, problems, src):
    header = (src / "ops" / "mtp" / "op_signatures.h").read_text()
    sources = "".join(p.read_text() for p in sorted((src / "ops" / "mtp").glob("*.cc")))
    calls = _strip_comments((src / "ops" / "mtp" / "python_calls.cc").read_text())
    for registered, args in table.registrations(op).items():
        macro = registered.upper() + "_SIGNATURE"
        m = re.search(rf"#define {macro} \\(.*?)(?:\n\n|\Z)", header, re.S)
        if not m:
            problems.append(f"op_signatures.h: {registered}: no {macro}")
            continue
        body = m.group(1)
        part = {key: re.search(rf"\.{key}\(\{{(.*?)\}}\)", body, re.S) for key in ("Inputs", "Outputs", "Attrs")}
        inplace = re.findall(r"\{\"(\w+)\", \"(\w+)\"\}", (re.search(r"\.SetInplaceMap\((.*)", body, re.S)
                                                            or re.search("()", "")).group(1))
        names = [a.name for a in args]
        written = [a.name for a in args if a.written]
        expected = {
            "Inputs": names,
            "Outputs": (["msg"] if op.returns_msg else []) + [f"{n}_out" for n in written],
            "Attrs": [f"{n}: {t}" for n, t in op.attrs] + ["ncluster: int"],
        }
        for key, want in expected.items():
            got = _quoted(part[key].group(1)) if part[key] else []
            if got != want:
                problems.append(f"op_signatures.h: {registered}: {key} {got} != {want}")
        if inplace != [(n, f"{n}_out") for n in written]:
            problems.append(f"op_signatures.h: {registered}: in-place map {inplace} != the written arguments "
                            f"{written} (OPS §2.5)")
        if not re.search(rf"PD_BUILD_OP\({registered}\)\s+{macro}", sources):
            problems.append(f"ops/mtp: {registered}: not registered with {macro}")
        for name in (registered, f"fd_dispatch_floor_{registered}"):
            if not re.search(rf'm\.def\("{name}", ', calls):
                problems.append(f"ops/mtp/python_calls.cc: {name}: not bound (the Python entry calls it)")


def check_pybind(op, problems, src):
    text = (src / "ops" / "pybind" / "pybind.cc").read_text()
    m = re.search(rf"m\.def\(\s*\"{op.name}\",(.*?)(?:m\.def\(|\Z)", text, re.S)
    if not m:
        return problems.append(f"pybind.cc: {op.name}: not defined")
    got = [(n, bool(o)) for n, o in re.findall(r"numpy_arg\(\w+, op, \"(\w+)\"(, true)?\)", m.group(1))]
    want = [(a.name, a.optional) for a in op.args]
    if got != want:
        problems.append(f"pybind.cc: {op.name}: arguments {got} != {want}")


def check(src: Path = SRC) -> list[str]:
    """Every drift found, one line each; empty when all faces match the table. `src`: the custom_ops/xpu_ops/src
    tree to check (tests pass a mutated copy)."""
    table = load_table()
    problems: list[str] = []
    for op in table.OPS:
        check_plugin_h(op, problems, src)
        check_op_layer(op, problems, src)
        check_registrations(op, table, problems, src)
        check_pybind(op, problems, src)
    return problems


def main() -> int:
    problems = check()
    for line in problems:
        print(line)
    print(f"check_op_signatures: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
