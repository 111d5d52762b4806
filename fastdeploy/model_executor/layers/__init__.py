"""Building blocks shared by the embedded models: paged KV cache and transformer layers."""
