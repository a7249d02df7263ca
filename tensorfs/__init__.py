"""tensorfs: mount safetensors and GGUF model files as a read-only tree of tensors."""

__version__ = "0.1.0"
