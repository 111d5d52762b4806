"""Backend parametrization for the op tests: the C++ CPU path always, the emulated Kunlun3 kernel with 1, 2 and 12
clusters (OPS §8 C1) under the `emulator` marker (deselect with `-m "not emulator"`)."""

import pytest

from .harness import EMULATOR

BACKENDS = [
    pytest.param(("cpu", 0), id="cpu"),
    *(pytest.param((EMULATOR, n), id=f"emu{n}", marks=pytest.mark.emulator) for n in (1, 2, 12)),
]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """(backend name, ncluster) passed to `ops.use_backend`."""
    return request.param
