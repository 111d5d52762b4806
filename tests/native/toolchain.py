"""What native tooling this machine has, so the tests that need it skip with a reason instead of failing."""

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path


def have_cmake_and_gxx() -> bool:
    return shutil.which("cmake") is not None and shutil.which("g++") is not None


@functools.cache
def sanitizer_runs(*flags: str) -> bool:
    """True when g++ can build and run a trivial program with these -fsanitize flags (the runtime libraries,
    e.g. libasan or libtsan, are installed)."""
    if shutil.which("g++") is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "probe.cc", Path(tmp) / "probe"
        source.write_text("int main() { return 0; }\n")
        built = subprocess.run(["g++", *flags, str(source), "-o", str(binary)], capture_output=True)
        return built.returncode == 0 and subprocess.run([str(binary)], capture_output=True).returncode == 0
