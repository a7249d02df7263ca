"""A Hugging Face model directory as the GGUF that llama.cpp's convert_hf_to_gguf.py writes."""
