"""get_model: the registry the runner uses to find models by name (docs/design.md §3)."""
import pytest

from fastdeploy.model_executor.models import MODEL_NAMES, get_model


def test_registry_exposes_the_interface_attributes():
    """Every registered model carries the attributes of the Model contract."""
    assert set(MODEL_NAMES) == {"fd-toy", "fd-tiny"}
    toy = get_model("fd-toy", mtp_agreement=0.5)
    assert (toy.name, toy.vocab_size, toy.eos_token_ids, toy.num_target_layers, toy.num_mtp_layers) == \
        ("fd-toy", 259, (257,), 1, 1)
    assert len(toy.kv_layer_tails()) == toy.num_target_layers + toy.num_mtp_layers


@pytest.mark.parametrize("name, dtype, field", [("gpt-2", "float32", "'name'"), ("fd-toy", "bfloat16", "'dtype'")])
def test_unknown_name_or_dtype_is_rejected(name, dtype, field):
    """Errors name the argument."""
    with pytest.raises(ValueError, match=field):
        get_model(name, dtype=dtype)
