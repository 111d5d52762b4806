"""layers/moe.py against a NumPy float64 reference written from the published routing (docs/models.md "ERNIE-4.5
MoE and MTP"): softmax over float32 gate logits, top-k chosen on p + correction bias, weights the un-biased p
renormalised by max(sum, moe_norm_min), SwiGLU experts, shared experts added unweighted."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.moe import ErnieMoE, MoEConfig

H, I, E, K, S = 16, 12, 8, 3, 2


def _silu(x):
    return x / (1.0 + np.exp(-x))


def reference_moe(x, w, norm_min):
    """The published formula, token by token, in float64. w: dict of NumPy arrays in checkpoint orientation
    (gate [E, H], bias [E], experts' gate/up [E, I, H] and down [E, H, I] as [out, in], shared likewise)."""
    out = np.zeros_like(x)
    for t, row in enumerate(x):
        logits = w["gate"] @ row
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = np.argsort(-(p + w["bias"]), kind="stable")[:w["k"]]
        weights = p[chosen] / max(p[chosen].sum(), norm_min)
        for j, e in zip(chosen, weights):
            hidden = _silu(w["e_gate"][j] @ row) * (w["e_up"][j] @ row)
            out[t] += e * (w["e_down"][j] @ hidden)
        if "s_gate" in w:
            out[t] += w["s_down"] @ (_silu(w["s_gate"] @ row) * (w["s_up"] @ row))
    return out


def reference_choice(x, w):
    chosen = []
    for row in x:
        logits = w["gate"] @ row
        p = np.exp(logits - logits.max())
        chosen.append(set(np.argsort(-(p / p.sum() + w["bias"]))[:w["k"]].tolist()))
    return chosen


def random_weights(rng, shared=S, k=K):
    w = {"k": k, "gate": rng.normal(0, 0.6, (E, H)).astype(np.float32).astype(np.float64),
         "bias": rng.normal(0, 0.08, E).astype(np.float32).astype(np.float64),
         "e_gate": rng.normal(0, 0.3, (E, I, H)), "e_up": rng.normal(0, 0.3, (E, I, H)),
         "e_down": rng.normal(0, 0.3, (E, H, I))}
    if shared:
        w.update(s_gate=rng.normal(0, 0.3, (I * shared, H)), s_up=rng.normal(0, 0.3, (I * shared, H)),
                 s_down=rng.normal(0, 0.3, (H, I * shared)))
    return w


def build_layer(w, norm_min=1e-12, dtype="float64"):
    shared = w["s_gate"].shape[0] // I if "s_gate" in w else 0
    layer = ErnieMoE(MoEConfig(H, I, E, w["k"], shared, norm_min), dtype)
    layer.gate_weight.set_value(w["gate"].astype(np.float32))
    layer.e_score_correction_bias.set_value(w["bias"].astype(np.float32))
    up_gate = np.concatenate([w["e_gate"].transpose(0, 2, 1), w["e_up"].transpose(0, 2, 1)], axis=2)
    for e in range(E):
        layer.experts_up_gate[e].weight.set_value(up_gate[e].astype(dtype))
        layer.experts_down[e].weight.set_value(w["e_down"][e].T.astype(dtype))
    if shared:
        layer.shared.gate_up.weight.set_value(np.concatenate([w["s_gate"].T, w["s_up"].T], axis=1).astype(dtype))
        layer.shared.down.weight.set_value(w["s_down"].T.astype(dtype))
    return layer


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    w = random_weights(rng)
    x = rng.normal(0, 1.0, (40, H))
    return w, x


def test_matches_the_published_formula_float64(case):
    w, x = case
    got = build_layer(w)(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(got, reference_moe(x, w, 1e-12), rtol=0, atol=1e-6)


def test_the_correction_bias_changes_the_choice_but_is_no_weight(case):
    """Non-vacuity of the test above: on these inputs the bias moves the top-k of some tokens, so selecting
    without it, or weighting with p + bias, gives another answer."""
    w, x = case
    plain = dict(w, bias=np.zeros(E))
    moved = sum(a != b for a, b in zip(reference_choice(x, w), reference_choice(x, plain)))
    assert moved >= 3
    chosen, weights = build_layer(w).route(paddle.to_tensor(x))
    assert [set(r) for r in chosen.tolist()] == reference_choice(x, w)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-6)


def test_norm_min_bounds_the_renormalisation(case):
    """With moe_norm_min above the chosen mass the weights are p / norm_min (the clamp, not a plain division)."""
    w, x = case
    got = build_layer(w, norm_min=4.0)(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(got, reference_moe(x, w, 4.0), rtol=0, atol=1e-6)
    assert np.abs(got - reference_moe(x, w, 1e-12)).max() > 1e-2


def test_without_shared_experts_and_top_1():
    rng = np.random.default_rng(1)
    w = random_weights(rng, shared=0, k=1)
    x = rng.normal(0, 1.0, (9, H))
    np.testing.assert_allclose(build_layer(w)(paddle.to_tensor(x)).numpy(), reference_moe(x, w, 1e-12),
                               rtol=0, atol=1e-6)


def test_only_routed_experts_are_computed(case):
    """An expert no token is routed to may hold NaN: grouping by expert never multiplies it (no dense product)."""
    w, x = case
    x = x[:1]
    layer = build_layer(w)
    chosen = set(layer.route(paddle.to_tensor(x))[0][0].tolist())
    unused = [e for e in range(E) if e not in chosen]
    for e in unused:
        layer.experts_up_gate[e].weight.set_value(np.full(layer.experts_up_gate[e].weight.shape, np.nan))
    out = layer(paddle.to_tensor(x)).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, reference_moe(x, w, 1e-12), rtol=0, atol=1e-6)


def test_a_token_routes_the_same_alone_and_in_a_batch(case):
    """The router's choice and weights bit for bit (each row's logits are its own product); the output within 1e-6
    (an expert's product over a run of several rows may round otherwise than over one)."""
    w, x = case
    layer = build_layer(w)
    batched = layer(paddle.to_tensor(x)).numpy()
    chosen, weights = layer.route(paddle.to_tensor(x))
    for t in (0, 17, 39):
        alone = layer.route(paddle.to_tensor(x[t:t + 1]))
        np.testing.assert_array_equal(alone[0][0], chosen[t])
        np.testing.assert_array_equal(alone[1][0], weights[t])
        np.testing.assert_allclose(layer(paddle.to_tensor(x[t:t + 1])).numpy()[0], batched[t], rtol=0, atol=1e-6)


def test_float32_experts_keep_a_float32_router(case):
    w, x = case
    layer = build_layer(w, dtype="float32")
    assert layer.gate_weight.dtype == paddle.float32 and layer.experts_down[0].weight.dtype == paddle.float32
    got = layer(paddle.to_tensor(x.astype(np.float32))).numpy()
    np.testing.assert_allclose(got, reference_moe(x, w, 1e-12), rtol=0, atol=2e-4)
    cast = build_layer(w, dtype="float32")
    cast.to(dtype="float64")                 # a whole-model cast: the router still computes in float32
    np.testing.assert_array_equal(cast.route(paddle.to_tensor(x))[1], layer.route(paddle.to_tensor(x))[1])


def test_an_empty_pass():
    layer = build_layer(random_weights(np.random.default_rng(2)))
    assert layer(paddle.zeros([0, H], "float64")).shape == [0, H]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="moe_k"):
        MoEConfig(H, I, 4, 5)
