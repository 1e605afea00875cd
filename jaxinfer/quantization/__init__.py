"""Weight-only quantization: quantized leaves and the matmul that reads them."""
