"""C5 errors (OPS §2.3, §8 C5): every checked precondition, violated once per op, raises ValueError whose message
starts with the op name and names the argument; all tensors are unchanged and the process stays alive.

Each violation is described once in NumPy terms and applied both to the reference and to the Python entry.
"""

from dataclasses import dataclass

import numpy as np
import paddle
import pytest

from reference.inputs import REFERENCES, gen_inputs

from .harness import call_op

B, R, T = 4, 3, 3
# The argument whose size defines B (or bsz): resizing it moves the error to another argument.
SIZE_DEFINING = {"speculate_clear_accept_nums": "accept_num", "speculate_save_output": "accept_tokens"}
R_ARGS = {"seq_lens_this_time", "seq_lens"}
# Matrices whose column count must equal another argument's (T or S).
MATCHED_COLUMNS = {
    "speculate_update": ["accept_tokens"],
    "speculate_set_stop_value_multi_seqs": ["stop_seqs_len"],
    "speculate_schedule_cache": ["step_draft_tokens", "accept_tokens"],
    "recover_decode_task": ["step_draft_tokens"],
}
SHARED_PAIRS = {
    "speculate_update": ("seq_lens_encoder", "seq_lens_decoder"),
    "speculate_set_value_by_flags_and_idx": ("seq_lens_encoder", "seq_lens_decoder"),
    "speculate_set_stop_value_multi_seqs": ("step_idx", "min_tokens"),
    "speculate_schedule_cache": ("seq_lens_encoder", "seq_lens_decoder"),
    "recover_decode_task": ("seq_lens_encoder", "seq_lens_decoder"),
    "speculate_clear_accept_nums": ("accept_num", "seq_lens_decoder"),
    "speculate_save_output": ("accept_num", "seq_lens_decoder"),
}
BAD_ATTRS = {
    "speculate_schedule_cache": [("block_size", True), ("block_size", 0), ("max_draft_tokens", -1),
                                 ("max_draft_tokens", False), ("prefill_one_step_stop", 1)],
    "recover_decode_task": [("block_size", False), ("block_size", 0), ("max_draft_tokens", -1),
                            ("max_draft_tokens", True)],
    "speculate_save_output": [("rank_id", -1), ("rank_id", True), ("save_each_rank", 1), ("skip_prefill", 0)],
}
OTHER_DTYPE = {np.dtype(np.int32): np.int64, np.dtype(np.int64): np.int32, np.dtype(np.bool_): np.int32}


class NonContiguous:
    """Marks an argument to be passed as a strided view with the same values."""

    def __init__(self, array):
        self.array = array


class SameAs:
    """Marks an argument to be passed as the very tensor of another argument."""

    def __init__(self, other):
        self.other = other


class OverlapsWith:
    """Marks an argument to be passed as a view overlapping another argument's (both [B], shifted by one element)."""

    def __init__(self, other):
        self.other = other


@dataclass
class Violation:
    id: str
    args: tuple[str, ...]  # acceptable argument names in the message (one, or either of a sharing pair)
    tensors: dict
    attrs: dict


def base_case(op):
    speculative = {"speculative": True} if op == "recover_decode_task" else {}
    case = gen_inputs(op, 7, B, R, T, **speculative)
    for name, a in case.tensors.items():  # per-slot vectors as [B] so that shapes are easy to break
        if a is not None and a.ndim == 2 and a.shape[1] == 1:
            case.tensors[name] = np.ascontiguousarray(a.reshape(-1))
    return case


def violations(op):
    case = base_case(op)
    out = []

    def add(vid, args, **changes):
        tensors, attrs = dict(case.tensors), dict(case.attrs)
        for k, v in changes.items():
            (attrs if k in attrs else tensors)[k] = v
        out.append(Violation(vid, args if isinstance(args, tuple) else (args,), tensors, attrs))

    for name, a in case.tensors.items():
        add(f"dtype-{name}", name, **{name: a.astype(OTHER_DTYPE[a.dtype])})
        if a.size > 1:
            add(f"noncontiguous-{name}", name, **{name: NonContiguous(a)})
        if name == SIZE_DEFINING.get(op, "stop_flags"):
            continue
        if name in R_ARGS:
            add(f"R-greater-than-B-{name}", name, **{name: np.zeros([B + 1], a.dtype)})
            add(f"R-zero-{name}", name, **{name: np.zeros([0], a.dtype)})
        elif name == "not_need_stop":
            add("not_need_stop-two-elements", name, not_need_stop=np.zeros([2], a.dtype))
        elif name == "end_ids":
            add("end_ids-empty", name, end_ids=np.zeros([0], a.dtype))
        elif name == "stop_seqs":
            add("stop_seqs-2d", name, stop_seqs=np.ascontiguousarray(a[:, 0, :]))
        else:
            add(f"shape-{name}", name, **{name: np.concatenate([a, a[:1]])})
    for name in MATCHED_COLUMNS.get(op, []):
        a = case.tensors[name]
        add(f"columns-{name}", name, **{name: np.concatenate([a, a[:, :1]], axis=1)})
    first, second = SHARED_PAIRS[op]
    add(f"shared-storage-{first}-{second}", (first, second), **{second: SameAs(first)})
    add(f"overlapping-views-{first}-{second}", (first, second), **{second: OverlapsWith(first)})
    for attr, value in BAD_ATTRS.get(op, []):
        add(f"attr-{attr}-{value!r}", attr, **{attr: value})
    if op == "speculate_update":
        big = gen_inputs(op, 7, 513, 513, T)
        out.append(Violation("B-above-512", ("stop_flags",), big.tensors, {}))
        zero_width = {k: np.zeros([B, 0], np.int64) for k in ("draft_tokens", "accept_tokens")}
        add("T-zero-draft_tokens", "draft_tokens", **zero_width)
    if op == "recover_decode_task":
        optional = ("draft_tokens", "step_draft_tokens", "step_seq_lens_this_time")
        for missing in optional:
            add(f"optional-{missing}-missing", missing, **{missing: None})
        add("optional-only-draft_tokens-given", "step_draft_tokens", step_draft_tokens=None,
            step_seq_lens_this_time=None)
    return out


def realize(tensors: dict, make):
    """Turns the violation's NumPy description into arguments built by `make` (NumPy or Paddle)."""
    built = {}
    for name, v in tensors.items():
        if isinstance(v, NonContiguous):
            doubled = np.repeat(v.array, 2, axis=v.array.ndim - 1)  # values at even positions of the last axis
            built[name] = make(doubled)[..., ::2]
        elif isinstance(v, SameAs):
            built[name] = built[v.other]
        elif isinstance(v, OverlapsWith):
            a = tensors[v.other]
            buffer = make(np.concatenate([a, a[-1:]]))
            built[v.other], built[name] = buffer[:-1], buffer[1:]
        else:
            built[name] = None if v is None else make(v)
    return built


def snapshot(args: dict) -> dict:
    return {k: None if v is None else np.array(v.numpy() if hasattr(v, "numpy") else v, copy=True)
            for k, v in args.items()}


def assert_error_names(err: ValueError, op: str, args: tuple[str, ...]):
    msg = str(err)
    assert msg.startswith(op), f"message does not start with the op name: {msg!r}"
    assert any(f"'{a}'" in msg for a in args), f"message names none of {args}: {msg!r}"


def assert_unchanged(before: dict, args: dict, context: str):
    for name, a in args.items():
        if a is not None:
            after = a.numpy() if hasattr(a, "numpy") else a
            np.testing.assert_array_equal(after, before[name], err_msg=f"{context}: '{name}' changed")


ALL = [(op, v) for op in REFERENCES for v in violations(op)]


@pytest.mark.parametrize("op,v", ALL, ids=[f"{op}-{v.id}" for op, v in ALL])
def test_reference_rejects_violation_naming_op_and_argument(op, v):
    """OPS §2.3: the reference performs the same validation (SHOULD) before any side effect."""
    args = realize(v.tensors, lambda a: np.array(a, copy=True))
    before = snapshot(args)
    with pytest.raises(ValueError) as err:
        REFERENCES[op](*args.values(), *v.attrs.values())
    assert_error_names(err.value, op, v.args)
    assert_unchanged(before, args, f"reference {op} {v.id}")


@pytest.mark.parametrize("op,v", ALL, ids=[f"{op}-{v.id}" for op, v in ALL])
def test_op_rejects_violation_naming_op_and_argument(op, v):
    """OPS §2.3 / §8 C5: ValueError naming op and argument; every tensor unchanged; the process continues."""
    args = realize(v.tensors, lambda a: paddle.to_tensor(a, place=paddle.CPUPlace()))
    before = snapshot(args)
    with pytest.raises(ValueError) as err:
        call_op(op, ("cpu", 0), list(args.values()), v.attrs)
    assert_error_names(err.value, op, v.args)
    assert_unchanged(before, args, f"{op} {v.id}")


@pytest.mark.parametrize("op", list(REFERENCES))
def test_first_failing_argument_in_order_is_reported(op):
    """OPS §2.3: with the first and the last tensor argument both of the wrong dtype, the first one is named."""
    case = base_case(op)
    names = [k for k, v in case.tensors.items() if v is not None]
    tensors = dict(case.tensors)
    for name in (names[0], names[-1]):
        tensors[name] = tensors[name].astype(OTHER_DTYPE[tensors[name].dtype])
    for who, make, run in (
            ("reference", lambda a: np.array(a, copy=True), lambda args: REFERENCES[op](*args, *case.attrs.values())),
            ("op", lambda a: paddle.to_tensor(a, place=paddle.CPUPlace()),
             lambda args: call_op(op, ("cpu", 0), args, case.attrs))):
        args = realize(tensors, make)
        with pytest.raises(ValueError) as err:
            run(list(args.values()))
        assert_error_names(err.value, op, (names[0],))
        assert f"'{names[-1]}'" not in str(err.value), who


@pytest.mark.skipif(not (paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu()),
                    reason="host-placement checks need a second place (GPU or XPU); this Paddle build is CPU-only")
def test_host_tensor_on_device_is_rejected():
    """OPS §2.2: not_need_stop must be a CPU tensor on every backend."""
    case = base_case("speculate_update")
    device = paddle.CUDAPlace(0) if paddle.is_compiled_with_cuda() else paddle.XPUPlace(0)
    args = {k: paddle.to_tensor(a, place=device) for k, a in case.tensors.items()}
    with pytest.raises(ValueError) as err:
        call_op("speculate_update", ("cpu", 0), list(args.values()), {})
    assert_error_names(err.value, "speculate_update", ("not_need_stop",))
