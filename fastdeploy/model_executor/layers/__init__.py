"""Building blocks shared by the models: paged KV cache, attention, rotary embedding, decoder layers."""
