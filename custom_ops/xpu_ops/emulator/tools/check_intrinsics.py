#!/usr/bin/env python3
"""Fails when a Kunlun3 kernel uses a device identifier that is neither C++ nor registered (XPU3_KERNEL_MODEL §12.3).

Checked identifiers: every name called like a function (``name(`` or ``name<...>(``) and every qualifier-shaped
name (``_x_`` / ``__x__``) in the ``.xpu`` files and the kernel headers they include. Allowed: C++ keywords and
casts, the first-column names of ``kl3_emu_intrinsics.md``, and functions defined in the scanned sources themselves
(kernels and ``src/kernel/include/*.h``).

Usage: check_intrinsics.py [FILE_OR_DIR ...]   (default: the plugin's kernel tree). Exit 1 on any violation.
"""

import re
import sys
from pathlib import Path

EMULATOR = Path(__file__).resolve().parents[1]
XPU_OPS = EMULATOR.parent
KERNEL_TREE = XPU_OPS / "src" / "plugin" / "src" / "kernel"
REGISTRY = EMULATOR / "kl3_emu_intrinsics.md"

CXX_WORDS = {
    "if", "for", "while", "switch", "return", "sizeof", "alignof", "static_cast", "reinterpret_cast",
    "const_cast", "decltype", "static_assert", "defined", "noexcept", "operator", "catch",
    "__attribute__",  # only as __attribute__((global)) in wrapper-style declarations
}
CXX_TYPES = {"int", "char", "bool", "long", "short", "unsigned", "signed", "void", "float", "double",
             "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t"}

# A function definition or declaration: at the start of a line, optional specifiers, a type, the name, "(".
DEFINITION = re.compile(
    r"^[ \t]*(?:template\s*<[^>]*>\s*)?(?:(?:static|inline|const|__device__|__global__)\s+)*"
    r"([A-Za-z_][\w:<>]*)[\s*&]+([A-Za-z_]\w*)\s*\(",
    re.M,
)
NOT_A_TYPE = {"return", "else", "case", "new", "delete", "throw", "goto", "do"}
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(")
QUALIFIER = re.compile(r"\b(_{1,2}[A-Za-z]\w*?_{1,2})\b")


def strip(source):
    """Removes comments, string/char literals and preprocessor lines."""
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    source = re.sub(r"//[^\n]*", " ", source)
    source = re.sub(r'"(\\.|[^"\\])*"', '""', source)
    source = re.sub(r"'(\\.|[^'\\])*'", "''", source)
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))


def registered_names():
    names = set()
    for line in REGISTRY.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\|\s*`([A-Za-z_]\w*)`\s*\|", line)
        if m:
            names.add(m.group(1))
    return names


def sources(args):
    paths = [Path(a) for a in args] or [KERNEL_TREE]
    files = []
    for p in paths:
        files += sorted(p.rglob("*.xpu")) + sorted(p.rglob("*.h")) if p.is_dir() else [p]
    headers = sorted((KERNEL_TREE / "include").glob("*.h"))
    return sorted(set(files)), headers


def main(argv):
    files, headers = sources(argv[1:])
    registry = registered_names()
    texts = {f: strip(f.read_text(encoding="utf-8")) for f in set(files) | set(headers)}
    defined = {name for text in texts.values() for rtype, name in DEFINITION.findall(text) if rtype not in NOT_A_TYPE}
    allowed = registry | defined | CXX_WORDS | CXX_TYPES
    violations = []
    for f in files:
        for lineno, line in enumerate(texts[f].splitlines(), 1):
            used = set(CALL.findall(line)) | set(QUALIFIER.findall(line))
            for name in sorted(used - allowed):
                violations.append(f"{f}:{lineno}: '{name}' is neither C++ nor registered in {REGISTRY.name}")
    for v in violations:
        print(v)
    print(f"check_intrinsics: {len(files)} files, {len(violations)} unregistered identifiers")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
