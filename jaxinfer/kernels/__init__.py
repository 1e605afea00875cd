"""Platform glue: native CPU kernels and matmul precision."""
