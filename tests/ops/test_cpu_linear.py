"""The CPU linear ops (OPS §10) against their NumPy reference: bf16 and weight-only (WINT8 / WINT4) products
through both kernels (the project's AVX512_BF16 kernel, where the CPU has it, and oneDNN), and the weight-only
quantizer's semantics (per output channel, symmetric, round half away from zero, scale in the model's dtype).

Tolerance (OPS §10.3): the kernel equals the reference product bf16(x) @ W_stored computed in float64 within
1e-5 of the output's largest magnitude; only the float32 accumulation order differs."""
import gc
import os

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.quantization import building, method_for
from fastdeploy.model_executor.layers.quantization.base import (CPU_KERNEL, KERNEL_DPBF16, KERNEL_ONEDNN,
                                                                cpu_linear, cpu_pack)
from fastdeploy.model_executor.layers.quantization.weight_only import dequantize, quantize, round_to_bf16
from fastdeploy.model_executor.layers.transformer import Linear
from fastdeploy.precision import Precision, Quantization

TOLERANCE = 1e-5
# odd sizes, K not a multiple of the kernels' blocks (pairs; oneDNN's 16 / 32 / 64), N not a multiple of 64
# columns, an odd N for int4's byte rows; 1, 3 (one register tile), 5 (two tiles) and 64 rows
SHAPES = [(1, 64, 48), (1, 37, 1001), (3, 100, 7), (5, 33, 130), (64, 1000, 258), (64, 129, 31), (2, 1, 1)]
KINDS = {"bfloat16": 0, "wint8": 1, "wint4": 2, "float32": 3}
KERNELS = [pytest.param(KERNEL_ONEDNN, id="onednn"),
           pytest.param(KERNEL_DPBF16, id="dpbf16", marks=pytest.mark.skipif(
               CPU_KERNEL != KERNEL_DPBF16,
               reason="this CPU lacks avx512_bf16 or avx512vbmi: the own kernel cannot run"))]


def _layer(precision: Precision, k: int, n: int) -> Linear:
    with building(precision):
        return Linear(k, n)


def _reference(x: np.ndarray, stored: np.ndarray, exact_x: bool = False) -> np.ndarray:
    """bf16(x) @ W' in float64; for float32 weights x as is (the float32 kernel does not round it)."""
    return (x if exact_x else round_to_bf16(x)).astype(np.float64) @ stored.astype(np.float64)


def _check(got: np.ndarray, want: np.ndarray) -> None:
    scale = max(float(np.abs(want).max()), 1e-30)
    assert np.abs(got - want).max() / scale <= TOLERANCE, np.abs(got - want).max() / scale


def _packed(method: str, w: np.ndarray, kernel: int):
    """(packed, scales, the weights the product multiplies by) for one kind."""
    if method == "float32":
        if kernel != KERNEL_DPBF16:
            pytest.skip("float32 weights are kernel 1's only (elsewhere Paddle's matmul)")
        return cpu_pack(w, 3, kernel), None, w
    if method == "bfloat16":
        return cpu_pack(w, 0, kernel), None, round_to_bf16(w)
    q, scale = quantize(w, 8 if method == "wint8" else 4)
    return cpu_pack(q, KINDS[method], kernel), paddle.to_tensor(scale), dequantize(q, scale)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("method", list(KINDS))
def test_each_kernel_equals_its_reference(method, m, k, n, kernel):
    rng = np.random.default_rng(m * 1000 + k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed, scales, stored = _packed(method, w, kernel)
    _check(cpu_linear(paddle.to_tensor(x), packed, scales, k, n, KINDS[method], kernel).numpy(),
           _reference(x, stored, exact_x=method == "float32"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_int8_value_widens_exactly(kernel):
    """Each of the 255 int8 values in every column and in every lane of a chunk (the own kernel widens them through
    lookup tables, OPS §10.5), with x of one-hot rows: out is the weight itself, exactly; all rows at once (the
    own kernel widens a block once into a panel) and 3 rows at a time (widened on the fly)."""
    k, n = 255, 130
    q = ((np.arange(k)[:, None] + 7 * np.arange(n)[None, :]) % 255 - 127).astype(np.int8)
    x = np.eye(k, dtype=np.float32)
    packed, ones = cpu_pack(q, 1, kernel), paddle.ones([n], "float32")
    np.testing.assert_array_equal(cpu_linear(paddle.to_tensor(x), packed, ones, k, n, 1, kernel).numpy(), q)
    for r in range(0, k, 3):
        np.testing.assert_array_equal(cpu_linear(paddle.to_tensor(x[r:r + 3]), packed, ones, k, n, 1, kernel).numpy(),
                                      q[r:r + 3])


@pytest.mark.skipif(CPU_KERNEL != KERNEL_DPBF16, reason="columns come from kernel 1's layout only")
@pytest.mark.parametrize("method", ["bfloat16", "float32"])
def test_the_columns_of_a_pack_are_the_weights_as_stored(method):
    """fd_cpu_packed_columns (a tied head read as the embedding): column j of W as row j, bit for bit."""
    from fastdeploy.model_executor.layers.quantization.base import cpu_columns
    rng = np.random.default_rng(9)
    k, n = 77, 130   # K odd (a pad row), N not a multiple of 64 (a pad block)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed, _, stored = _packed(method, w, KERNEL_DPBF16)
    ids = np.array([0, 129, 64, 5, 5, 63], np.int64)
    got = cpu_columns(packed, paddle.to_tensor(ids), k, n, KINDS[method]).numpy()
    np.testing.assert_array_equal(got, stored[:, ids].T)
    with pytest.raises(Exception, match="argument 'ids'"):
        cpu_columns(packed, paddle.to_tensor(np.array([n], np.int64)), k, n, KINDS[method])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("method", list(KINDS))
def test_a_row_does_not_depend_on_the_batch(method, kernel):
    """OPS §10.3: each row of out is bit for bit the product of that row alone, whatever M (1 row, one register
    tile, several tiles, the integer kinds' widened panel, kernel 1's FMA route where this CPU takes it): a verify
    pass computes each row as a decode would. Rows of every scale, elements spread over six decades, and rows down
    to bf16's denormals, whose products the FMA route must flush as vdpbf16ps does."""
    rng = np.random.default_rng(7)
    k, n = 301, 200
    packed, scales, _ = _packed(method, rng.standard_normal((k, n)).astype(np.float32), kernel)
    x = rng.standard_normal((67, k)) * 10.0 ** rng.integers(-3, 3, size=(67, k))
    x = (x * 10.0 ** rng.integers(-40, 8, size=(67, 1))).astype(np.float32)
    x[:, :3] = [1e-39, -3e-40, 2e-38]   # denormal in bf16 and float32, in every row
    alone = np.concatenate([cpu_linear(paddle.to_tensor(x[i:i + 1]), packed, scales, k, n, KINDS[method], kernel)
                            .numpy() for i in range(len(x))])
    for m in (2, 4, 5, 67):
        batch = cpu_linear(paddle.to_tensor(x[:m]), packed, scales, k, n, KINDS[method], kernel).numpy()
        np.testing.assert_array_equal(batch, alone[:m], err_msg=f"M = {m}")


def test_a_strided_input_and_zero_rows():
    w = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    layer = _layer(Precision("bfloat16", Quantization("wint8", "wint8")), 32, 16)
    layer.load_weight(w)
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((32, 6)).astype(np.float32)).T   # a view
    _check(layer(x).numpy(), _reference(x.numpy(), dequantize(*quantize(w, 8))))
    assert tuple(layer(paddle.zeros([0, 32], "float32")).shape) == (0, 16)


def test_scales_are_per_output_channel_and_symmetric():
    """Column n of W [in, out] is output channel n: its scale is max |W[:, n]| / qmax, the largest entry maps to
    +-qmax exactly, and every column dequantizes within half a step of itself."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 24)).astype(np.float32) * np.linspace(0.1, 10, 24, dtype=np.float32)
    for bits, qmax in ((8, 127), (4, 7)):
        q, scale = quantize(w, bits, "float32")
        np.testing.assert_array_equal(scale, np.abs(w).max(axis=0) / np.float32(qmax))
        assert q.min() >= -qmax and q.max() <= qmax
        assert (np.abs(q).max(axis=0) == qmax).all()
        assert (np.abs(dequantize(q, scale) - w) <= scale / 2 * (1 + 1e-6)).all()


def test_rounding_is_half_away_from_zero_and_the_scale_in_the_model_dtype():
    w = np.array([[127.0, -127.0], [0.5, -0.5], [1.5, -2.5]], np.float32)   # scale 1 in both columns
    q, scale = quantize(w, 8, "float32")
    np.testing.assert_array_equal(scale, [1.0, 1.0])
    np.testing.assert_array_equal(q, [[127, -127], [1, -1], [2, -3]])
    odd = np.array([[1.0], [0.3]], np.float32)
    assert quantize(odd, 8, "bfloat16")[1][0] == round_to_bf16(np.float32(1.0) / np.float32(127))
    zero = np.zeros((4, 2), np.float32)
    np.testing.assert_array_equal(dequantize(*quantize(zero, 4)), zero)


def test_stored_bytes_follow_the_precision():
    k, n = 256, 512
    sizes = {}
    for name, precision in (("float32", Precision()), ("bfloat16", Precision("bfloat16")),
                            ("wint8", Precision("bfloat16", Quantization("wint8", "wint8"))),
                            ("wint4", Precision("bfloat16", Quantization("wint4", "wint4")))):
        layer = _layer(precision, k, n)
        layer.load_weight(np.ones((k, n), np.float32))
        sizes[name] = layer.method.stored_bytes(layer)
    assert sizes == {"float32": k * n * 4, "bfloat16": k * n * 2, "wint8": k * n + 4 * n, "wint4": k * n // 2 + 4 * n}
    # both kernels' layouts hold exactly the weights for these sizes (K even, N a multiple of 64)


def test_the_head_is_never_quantized():
    with building(Precision("bfloat16", Quantization("wint4", "wint4"))):
        assert type(method_for("head")).__name__ == "HalfPrecision"
        assert type(method_for("dense")).__name__ == "WeightOnly"


def test_bad_arguments_are_refused_by_name():
    packed = cpu_pack(np.ones((8, 4), np.float32), 0)
    with pytest.raises(Exception, match="argument 'x'"):
        cpu_linear(paddle.ones([2, 9], "float32"), packed, None, 8, 4, 0)
    with pytest.raises(Exception, match="argument 'packed'"):
        cpu_linear(paddle.ones([2, 256], "float32"), packed, None, 256, 256, 0)
    with pytest.raises(Exception, match="int4 values"):
        cpu_pack(np.full((2, 2), 9, np.int8), 2)
    with pytest.raises(Exception, match=r"int8 values must be in \[-127, 127\]"):
        cpu_pack(np.full((2, 2), -128, np.int8), 1)
    with pytest.raises(Exception, match="argument 'kernel'"):
        cpu_pack(np.ones((8, 4), np.float32), 0, 2)
    with pytest.raises(Exception, match="argument 'scales'"):
        cpu_linear(paddle.ones([1, 8], "float32"), cpu_pack(np.ones((8, 5), np.int8), 2), paddle.ones([6], "float32"),
                   8, 5, 2)
    with pytest.raises(ValueError, match="float16"):
        with building(Precision("float16")):
            Linear(4, 4)


_THREADED_PRODUCT = """
import sys, hashlib
import numpy as np, paddle
from fastdeploy.model_executor.layers.quantization.base import cpu_linear, cpu_pack
from fastdeploy.model_executor.layers.quantization.weight_only import quantize
rng = np.random.default_rng(11)
q, scale = quantize(rng.standard_normal((1024, 1000)).astype(np.float32), 4)
x = paddle.to_tensor(rng.standard_normal((3, 1024)).astype(np.float32))
out = cpu_linear(x, cpu_pack(q, 2, int(sys.argv[1])), paddle.to_tensor(scale), 1024, 1000, 2, int(sys.argv[1]))
print(hashlib.sha256(out.numpy().tobytes()).hexdigest())
"""


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_thread_count_changes_no_bit(kernel):
    """OPS §10.5: threads split column blocks, each block one thread's, so 1 and 2 threads give the same bits."""
    import os
    import subprocess
    import sys

    def digest(threads: int) -> str:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        return subprocess.run([sys.executable, "-c", _THREADED_PRODUCT, str(kernel)], env=env, check=True,
                              capture_output=True, text=True).stdout.strip().splitlines()[-1]

    assert digest(1) == digest(2)


def _mapping_of(address: int) -> dict | None:
    """The /proc/self/smaps entry (start, end, flags) of the mapping holding `address`, None if none does."""
    entry = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:   # a mapping's first line: start-end perms offset dev inode ...
                start, end = (int(v, 16) for v in head[0].split("-"))
                entry = {"start": start, "end": end} if start <= address < end else None
            elif entry is not None and line.startswith("VmFlags:"):
                entry["flags"] = head[1:]
                return entry
    return None


@pytest.mark.skipif(not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
                    reason="this kernel has no transparent huge pages")
@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_weights_live_in_huge_page_arenas_freed_with_them(kernel):
    """OPS §10.1: every packed buffer, small ones included, lies in a mapping of the op's own advised for huge pages
    (smaps flag "hg") and 64-byte aligned; the mapping goes when the last tensor in it does (a buffer larger than
    an arena's 64 MiB gets one of its own: other tests' models may hold tensors in the shared current arena)."""
    packs = [cpu_pack(np.ones((k, 256), np.int8), 1, kernel) for k in (64, 1000, 4096)]
    packs.append(cpu_pack(np.ones((8192, 8448), np.int8), 1, kernel))   # 66 MiB
    for pack in packs:
        mapping = _mapping_of(pack.data_ptr())
        assert mapping is not None and "hg" in mapping["flags"], mapping
        assert pack.data_ptr() % 64 == 0
    alone = packs[-1].data_ptr()
    del packs, pack
    gc.collect()
    assert _mapping_of(alone) is None or "hg" not in _mapping_of(alone)["flags"]
