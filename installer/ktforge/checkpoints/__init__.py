"""Feeding them: safetensors reading and writing, Hugging Face checkpoints, `kt convert`."""
