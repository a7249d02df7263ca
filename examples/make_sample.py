"""Write the small sample model that `make demo` mounts: a tiny llama-shaped GGUF with
float and quantized tensors and a short vocabulary, made with gguf-py's own writer."""

import sys

import gguf
import numpy as np


def main(path: str) -> None:
    rng = np.random.default_rng(0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(61)]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tensorfs sample")
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([float(-i) for i in range(len(tokens))])
    writer.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), 64), dtype=np.float32))
    for block in range(2):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            weights = rng.standard_normal((64, 64), dtype=np.float32)
            quantized = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(f"blk.{block}.{name}.weight", quantized,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(f"blk.{block}.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("output.weight", rng.standard_normal((len(tokens), 64)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
