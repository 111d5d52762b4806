"""The KV connectors that make one LLMEngine a PD instance: base.py (the interface and the mixed role's),
prefill.py (P), decode.py (D). docs/design.md §6 states every hook and who calls it."""
