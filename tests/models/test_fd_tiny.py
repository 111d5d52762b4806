"""fd-tiny: paged transformer numerics, MTP module, committed weights (docs/design.md §3, PD_MTP_FLOW §10.3)."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.transformer import DenseCausalAttention
from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.fd_tiny import WEIGHTS_PATH, FdTiny, FdTinyConfig, FdTinyNet
from fastdeploy.model_executor.models.tokenizer import BOS_ID

from .paged_runner import packed_batch, scattered_tables

BLOCK = 4


@pytest.fixture(scope="module")
def model64() -> FdTiny:
    """Randomly initialised fd-tiny (seeded) in float64: numerics tests need no trained weights."""
    paddle.seed(0)
    return FdTiny(FdTinyNet(FdTinyConfig()), "float64")


def _prompt(rng, length):
    return [BOS_ID, *rng.integers(0, 256, length - 1).tolist()]


def test_positions_one_by_one_equal_all_at_once_float64(model64):
    """PD_MTP_FLOW §10.3: prefill in one pass vs one position per pass, and a 2-position verify vs two 1-position
    passes, give the same argmax (float64) and logits equal to 1e-10."""
    rng = np.random.default_rng(0)
    prompt = _prompt(rng, 19) + [ord("a"), ord("b")]
    table = scattered_tables(rng, 1, 6, 24)
    kv_all, kv_one = model64.new_kv_cache(24, BLOCK), model64.new_kv_cache(24, BLOCK)
    at_once, _ = model64.forward(packed_batch([prompt[:19]], [0], table), kv_all)
    verify, _ = model64.forward(packed_batch([prompt[19:]], [19], table), kv_all)
    at_once = np.concatenate([at_once.numpy(), verify.numpy()])
    one_by_one = np.concatenate([model64.forward(packed_batch([[t]], [p], table), kv_one)[0].numpy()
                                 for p, t in enumerate(prompt)])
    np.testing.assert_array_equal(at_once.argmax(1), one_by_one.argmax(1))
    np.testing.assert_allclose(at_once, one_by_one, rtol=0, atol=1e-10)


def test_packed_sequences_equal_sequences_run_alone_float64(model64):
    """A batch mixing a prefill chunk and decode tokens of other sequences gives each sequence its own result."""
    rng = np.random.default_rng(1)
    prompts = [_prompt(rng, n) for n in (7, 12, 3)]
    tables = scattered_tables(rng, 3, 5, 30)
    kv = model64.new_kv_cache(30, BLOCK)
    model64.forward(packed_batch([p[:-1] for p in prompts], [0, 0, 0], tables), kv)
    chunks = [prompts[0][-1:], prompts[1][-1:], prompts[2][-1:]]
    batched, _ = model64.forward(packed_batch(chunks, [len(p) - 1 for p in prompts], tables), kv)
    for i, prompt in enumerate(prompts):
        alone, _ = model64.forward(packed_batch([prompt], [0], tables[i:i + 1]), model64.new_kv_cache(30, BLOCK))
        np.testing.assert_allclose(batched.numpy()[i], alone.numpy()[-1], rtol=0, atol=1e-10)


def test_paged_attention_equals_the_dense_training_path(model64):
    """The serving path (K/V written to and read back from scattered blocks) computes what training computed."""
    rng = np.random.default_rng(2)
    prompt = _prompt(rng, 13)
    table = scattered_tables(rng, 1, 4, 16)
    _, hidden = model64.forward(packed_batch([prompt], [0], table), model64.new_kv_cache(16, BLOCK))
    with paddle.no_grad():
        dense = model64.net.target_hidden(paddle.to_tensor(prompt), paddle.arange(13), DenseCausalAttention(1, 13))
    np.testing.assert_allclose(hidden.numpy(), dense.numpy(), rtol=0, atol=1e-10)


def test_corrupting_one_cache_block_changes_the_logits(model64):
    """Attention reads the context from the blocks: overwrite one block of the prompt and the next logits move."""
    rng = np.random.default_rng(3)
    prompt = _prompt(rng, 10)
    table = np.array([[5, 2, 7, 0]], np.int32)
    kv = model64.new_kv_cache(8, BLOCK)
    model64.forward(packed_batch([prompt], [0], table), kv)
    clean, _ = model64.forward(packed_batch([[65]], [10], table), kv)
    kv.layers[0][2] = paddle.zeros_like(kv.layers[0][2])
    corrupt, _ = model64.forward(packed_batch([[65]], [10], table), kv)
    assert np.abs(clean.numpy() - corrupt.numpy()).max() > 1e-6


def test_mtp_forward_shapes_and_stepwise_equality_float64(model64):
    """MTP over all prompt positions at once equals position by position; logits [N, V], hidden [N, H]; its
    hidden chains (prev_hidden for the next draft) and it only touches its own cache layer."""
    rng = np.random.default_rng(4)
    prompt = _prompt(rng, 9)
    table = scattered_tables(rng, 1, 4, 16)
    kv = model64.new_kv_cache(16, BLOCK)
    logits, hidden = model64.forward(packed_batch([prompt], [0], table), kv)
    shifted = prompt[1:] + [int(logits.numpy()[-1].argmax())]
    target_kv = [t.numpy().copy() for t in kv.layers[:model64.num_target_layers]]
    mtp_logits, mtp_hidden = model64.mtp_forward(packed_batch([shifted], [0], table), hidden, kv)
    assert tuple(mtp_logits.shape) == (9, model64.vocab_size) and tuple(mtp_hidden.shape) == (9, 128)
    for before, after in zip(target_kv, kv.layers):
        np.testing.assert_array_equal(before, after.numpy())
    kv_step = model64.new_kv_cache(16, BLOCK)
    model64.forward(packed_batch([prompt], [0], table), kv_step)
    for p in range(9):
        step, _ = model64.mtp_forward(packed_batch([[shifted[p]]], [p], table), hidden[p:p + 1], kv_step)
        np.testing.assert_allclose(step.numpy()[0], mtp_logits.numpy()[p], rtol=0, atol=1e-10)
    chained, chained_hidden = model64.mtp_forward(packed_batch([[66]], [9], table), mtp_hidden[-1:], kv)
    assert tuple(chained.shape) == (1, model64.vocab_size) and tuple(chained_hidden.shape) == (1, 128)


def test_mtp_forward_rejects_a_misshaped_prev_hidden(model64):
    """Errors name the op and the argument."""
    kv = model64.new_kv_cache(4, BLOCK)
    with pytest.raises(ValueError, match="mtp_forward: argument 'prev_hidden'"):
        model64.mtp_forward(packed_batch([[1, 2]], [0], np.array([[0]], np.int32)), paddle.zeros([1, 128]), kv)


def test_committed_weights_load_in_float32_and_float64():
    """weights/fd_tiny.npz (≤ 10 MB, float32) loads; float64 is an exact cast; both decode the same tokens."""
    assert WEIGHTS_PATH.stat().st_size <= 10 * 1024 * 1024
    with np.load(WEIGHTS_PATH) as arrays:
        assert all(arrays[name].dtype == np.float32 for name in arrays.files)
    m32, m64 = get_model("fd-tiny"), get_model("fd-tiny", dtype="float64")
    w32, w64 = m32.net.embed.weight, m64.net.embed.weight
    assert w64.dtype == paddle.float64
    np.testing.assert_array_equal(w32.numpy().astype(np.float64), w64.numpy())
    prompt = m32.tokenizer.encode("Alice lives in ")
    table = np.arange(4, dtype=np.int32)[None]
    l32, _ = m32.forward(packed_batch([prompt], [0], table), m32.new_kv_cache(4, 8))
    l64, _ = m64.forward(packed_batch([prompt], [0], table), m64.new_kv_cache(4, 8))
    np.testing.assert_array_equal(l32.numpy().argmax(1), l64.numpy().argmax(1))


def test_missing_weights_file_is_reported_with_its_path(tmp_path):
    """A checkout without weights fails with the path and the command that makes them."""
    with pytest.raises(FileNotFoundError, match="train_fd_tiny"):
        FdTiny.from_pretrained(weights_path=tmp_path / "none.npz")
