"""The XPU branch of the op layer compiles here: the Paddle ops and op layer with PADDLE_WITH_XPU and the vendor
switches against Paddle's real headers and the project's XRE/XDNN declarations, the wrappers and the probe runner
as C++11 with launches type-checked (docs/kunlun3.md, "Compile check"; XPU3_KERNEL_MODEL §9, §10). Compile only:
nothing here is linked or run on a device."""

import re
import shutil
import subprocess
import sysconfig

import pytest

from tests.native.kl3_build_module import XPU_OPS, load_kl3_build

pytestmark = [pytest.mark.compile_check,
              pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")]


def _paddle_includes():
    from paddle.utils.cpp_extension.extension_utils import find_paddle_includes

    return find_paddle_includes() + [sysconfig.get_paths()["include"]]


def test_xpu_branch_compiles_against_paddle_headers_and_sdk_declarations(tmp_path):
    """XPU3_KERNEL_MODEL §9.4, §10: every translation unit of the vendor branch passes g++ -fsyntax-only -Werror."""
    kl3_build = load_kl3_build()
    try:  # pybind11 is a build requirement; when the test venv has it, the pybind module's branch is checked too
        import pybind11

        pybind_include = pybind11.get_include()
    except ImportError:
        pybind_include = None
    commands = kl3_build.compile_check_commands(_paddle_includes(), tmp_path, pybind_include=pybind_include)
    checked = {cmd[-1].rsplit("/", 1)[-1] for cmd in commands}
    assert {"paddle_ops_xpu_check.cc", "op_args.cc", "speculate_update.cpp", "probe_runner.cpp"} <= checked
    for cmd in commands:
        assert "-DKL3_VENDOR_BUILD" in cmd
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{cmd[-1]}:\n{result.stderr[-4000:]}"


def test_compile_check_fails_on_a_signature_drift(tmp_path):
    """The check is not vacuous: a launch whose arguments no longer match the kernel declaration fails
    (KL3_COMPILE_CHECK type-checks every KL3_LAUNCH, XPU3_KERNEL_MODEL §9.4 item 5)."""
    kl3_build = load_kl3_build()
    wrapper = XPU_OPS / "src" / "plugin" / "src" / "wrapper" / "mtp_wrapper" / "speculate_clear_accept_nums.cpp"
    broken = tmp_path / wrapper.name
    text = wrapper.read_text()
    launch = re.search(r"KL3_LAUNCH\(kernel::speculate_clear_accept_nums,[^;]*\);", text, re.S)
    assert launch is not None
    broken.write_text(text.replace(launch.group(0), launch.group(0).replace(", B)", ", B, B)")))
    [command] = [c for c in kl3_build.compile_check_commands(_paddle_includes(), tmp_path) if c[-1] == str(wrapper)]
    result = subprocess.run(command[:-1] + [str(broken)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "argument count differs" in result.stderr


def test_every_sdk_declaration_is_registered_with_source_and_evidence():
    """XPU3_KERNEL_MODEL §0, §12.3: each XRE/XDNN name the declarations provide is listed in DECLARATIONS.md with
    a source and an evidence tag."""
    decls = XPU_OPS / "xpu_sdk_decls"
    registry = (decls / "DECLARATIONS.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([A-Za-z_]\w*)` \|(.*)$", registry, re.M)}
    declared = set()
    for header in decls.rglob("*.h"):
        text = re.sub(r"//[^\n]*", "", header.read_text())
        declared |= set(re.findall(r"\b(?:typedef [^;]*?\b|struct |class |enum |namespace )\*?([A-Za-z_]\w*)\b", text))
        declared |= set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text)) - {"if", "sizeof"}
        declared |= set(re.findall(r"\b([A-Za-z_]\w*)\s*=\s*\d+", text))
    missing = sorted(n for n in declared if n not in rows and n not in {"extern", "baidu", "xpu", "api", "value", "struct", "void"})
    assert not missing, f"declared but not registered: {missing}"
    for name, rest in rows.items():
        assert re.search(r"\[(D|O|I)\b", rest), f"{name}: no evidence tag"
