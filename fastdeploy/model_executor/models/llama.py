"""Llama (`LlamaForCausalLM`: Llama 2 / 3 without scaled RoPE, TinyLlama, SmolLM, ...; docs/models.md
"Llama and Qwen2").

Pre-norm decoder: RMSNorm, GQA attention without bias, NeoX (halves) rotation over `head_dim` (hidden / heads
unless given), SwiGLU MLP without bias; LM head tied or not as `tie_word_embeddings` says (transformers' default:
not tied). No MTP module.
"""
from __future__ import annotations

from fastdeploy.model_executor.models.checkpoint import CheckpointConfig
from fastdeploy.model_executor.models.decoder_lm import CheckpointLM, DecoderShape, common_shape


class LlamaForCausalLM(CheckpointLM):
    ARCHITECTURE = "LlamaForCausalLM"

    @classmethod
    def decoder_shape(cls, config: CheckpointConfig) -> DecoderShape:
        for field in ("attention_bias", "mlp_bias"):
            if config.get(field, bool, False):
                raise config.invalid(f"config.json: field '{field}' true is not supported (Llama without biases)")
        return common_shape(config, rope_style="neox", qk_norm=False, tie_default=False)
