"""The quantization error on a trained model's weights (benchmarks/quantization_error.py, docs/benchmarks.md
"Quantization error"): fd-tiny, 1,280 held-out positions teacher-forced, each precision's stored weights against
float32. Measured: bf16 agreement 0.998 (layer error 0.0017), WINT8 0.997 (0.0055), WINT4 0.957 (0.10); the
bounds leave room for another CPU's float32 rounding, and a wrong scale axis or rounding exceeds them."""
from benchmarks.quantization_error import corpus, measure


def test_each_precision_keeps_the_trained_models_predictions():
    results = measure(corpus(8, 160))
    assert results["float32"]["positions"] >= 1000
    bounds = {"bfloat16": (0.003, 0.99), "wint8": (0.01, 0.99), "wint4": (0.15, 0.93)}
    for method, (layer_error, agreement) in bounds.items():
        r = results[method]
        assert r["layer error worst"] <= layer_error and r["agreement"] >= agreement, (method, r)
        assert abs(r["loss"] - results["float32"]["loss"]) <= 0.05, (method, r)
