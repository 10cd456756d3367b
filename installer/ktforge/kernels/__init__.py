"""Running them: the MoE layer's Python API over the native extension, and weight quantization."""
