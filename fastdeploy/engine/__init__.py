"""Serving engine: scheduler, resource manager, step loop (no paddle imports)."""
