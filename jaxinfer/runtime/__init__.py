"""Everything that touches jax state for the engine: step programs, inputs, pools, warm-up."""
