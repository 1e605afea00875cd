"""Validated settings: model, generation, engine, sampling, speculative; one `validation`."""
