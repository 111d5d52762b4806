"""The OpenAI-compatible HTTP front end of one instance (SERVICES §3)."""
