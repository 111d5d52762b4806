"""C3 guard bands (OPS §2.4, §8 C3, PD_MTP_FLOW I9): through the pybind module, each argument array is a view in
the middle of a larger buffer filled with canaries. No call may change a canary: for in-domain states (whose
results must also equal the reference's) and for arbitrary out-of-domain contents. The same raw-buffer access checks
the boolean convention of OPS §2.1 (inputs: nonzero means true; outputs: exactly 0 or 1)."""

import numpy as np
import pytest

from reference.inputs import GENERATORS, gen_inputs, run_reference

from .harness import EMULATOR, assert_results_equal, assert_states_equal

GUARD = 40  # canary elements on each side of every argument
CASES_PER_OP = 150
CANARY_BYTE = 0xA5


def pybind():
    from fastdeploy.model_executor.ops import _kl3_pybind
    return _kl3_pybind


def guarded(a: np.ndarray):
    """Returns (buffer, view): `view` is a C-contiguous copy of `a` with GUARD canary elements on each side."""
    buf = np.full((a.size + 2 * GUARD) * a.itemsize, CANARY_BYTE, np.uint8).view(a.dtype)
    view = buf[GUARD:GUARD + a.size].reshape(a.shape)
    view[...] = a
    return buf, view


def scramble(case, rng):
    """Out-of-domain contents: about half of every integer element replaced by a value from the dtype's range."""
    for name, a in case.tensors.items():
        if a is not None and a.dtype != np.bool_:
            info = np.iinfo(a.dtype)
            noise = rng.integers(info.min, info.max, size=a.shape, dtype=a.dtype, endpoint=True)
            case.tensors[name] = np.where(rng.random(a.shape) < 0.5, noise, a).astype(a.dtype)
    return case


def call_guarded(case, ncluster):
    """Calls the pybind op on guarded views; returns (views after the call, result, canaries intact per name)."""
    bufs, views = {}, {}
    for name, a in case.tensors.items():
        bufs[name], views[name] = (None, None) if a is None else guarded(a)
    fn = getattr(pybind(), case.op)
    result = fn(*views.values(), *case.attrs.values(), ncluster=ncluster)
    intact = {}
    for name, buf in bufs.items():
        if buf is not None:
            raw = buf.view(np.uint8)
            pad = GUARD * buf.itemsize
            intact[name] = bool((raw[:pad] == CANARY_BYTE).all() and (raw[-pad:] == CANARY_BYTE).all())
    return {k: None if v is None else v.copy() for k, v in views.items()}, result, intact


def draw_dims(rng):
    B = int(rng.integers(1, 40))
    return B, int(rng.integers(1, B + 1)), int(rng.integers(1, 9))


@pytest.mark.parametrize("op", list(GENERATORS))
def test_in_domain_calls_keep_canaries_and_match_reference(op, backend):
    """C3 + C1 over the plugin: canaries unchanged, every view equal to the reference."""
    ncluster = backend[1] if backend[0] == EMULATOR else 0
    rng = np.random.default_rng(99)
    for seed in range(CASES_PER_OP):
        B, R, T = draw_dims(rng)
        case = gen_inputs(op, seed, B, R, T)
        context = f"{op} ncluster={ncluster} seed={seed} B={B} R={R} T={T}"
        after, result, intact = call_guarded(case, ncluster)
        broken = [k for k, v in intact.items() if not v]
        assert not broken, f"{context}: canaries overwritten around {broken}"
        expected, expected_result = run_reference(case)
        assert_states_equal(after, expected, context)
        assert_results_equal(None if result is None else np.asarray(result), expected_result, context)


@pytest.mark.parametrize("op", list(GENERATORS))
def test_out_of_domain_calls_keep_canaries(op, backend):
    """OPS §2.4: no backend writes outside the argument tensors, for any contents."""
    ncluster = backend[1] if backend[0] == EMULATOR else 0
    rng = np.random.default_rng(2024)
    for seed in range(CASES_PER_OP):
        B, R, T = draw_dims(rng)
        case = scramble(gen_inputs(op, seed, B, R, T), rng)
        _, _, intact = call_guarded(case, ncluster)
        broken = [k for k, v in intact.items() if not v]
        assert not broken, f"{op} ncluster={ncluster} seed={seed}: canaries overwritten around {broken}"


def bool_bytes_scrambled(case, rng):
    """Every true bool element rewritten as a random nonzero byte (2..255); returns {name: raw bytes before}."""
    raw = {}
    for name, a in case.tensors.items():
        if a is not None and a.dtype == np.bool_:
            b = a.view(np.uint8).copy()
            b[b != 0] = rng.integers(2, 256, size=int((b != 0).sum()), dtype=np.uint8)
            case.tensors[name] = b.view(np.bool_)
            raw[name] = b
    return raw


@pytest.mark.parametrize("op", list(GENERATORS))
def test_boolean_inputs_read_as_nonzero_outputs_written_as_0_or_1(op, backend):
    """OPS §2.1: a bool byte 2..255 means true; every byte the op writes is 0 or 1."""
    ncluster = backend[1] if backend[0] == EMULATOR else 0
    rng = np.random.default_rng(7)
    for seed in range(CASES_PER_OP // 3):
        B, R, T = draw_dims(rng)
        clean = gen_inputs(op, seed, B, R, T)
        expected, expected_result = run_reference(clean)
        case = clean.copy()
        raw_before = bool_bytes_scrambled(case, rng)
        after, result, _ = call_guarded(case, ncluster)
        context = f"{op} ncluster={ncluster} seed={seed}"
        for name, before in raw_before.items():
            raw_after = after[name].view(np.uint8)
            assert ((raw_after == before) | (raw_after <= 1)).all(), f"{context}: '{name}' written with a byte > 1"
            after[name] = raw_after != 0
        assert_states_equal(after, expected, context)
        assert_results_equal(None if result is None else np.asarray(result), expected_result, context)
