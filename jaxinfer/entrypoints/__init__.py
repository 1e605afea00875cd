"""Ways in: the `LLM` facade, the CLI and the OpenAI-compatible server."""
