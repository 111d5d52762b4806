"""Step-message processing."""
