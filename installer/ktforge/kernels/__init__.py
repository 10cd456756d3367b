"""Running them: the MoE layer's Python API over the native extension, and weight quantization."""

# The most worker threads a layer takes (MoE, kt bench, ktforge.transformers): beyond it is a
# typo, and each thread costs a stack. Here, not in .moe: importing .moe checks the build.
MAX_THREADS = 4096
# How the formats with int8 activations scale them (MoE(activations=...), kt bench --activations)
ACTIVATIONS = ("per-block", "per-token")
