#!/usr/bin/env python3
"""Turns a llama-architecture GGUF file into what keel's model loads
(examples/models): run by scripts/fetch-deps.sh in keel's virtual
environment.

    convert-gguf.py MODEL.gguf OUT_DIR

OUT_DIR receives
  model.safetensors  every weight dequantized to float32 by the gguf
                     package (`gguf.quants.dequantize`, the reader
                     transformers uses), under Hugging Face's Llama names,
                     with the query and key rows put back in Hugging Face's
                     order (GGUF interleaves each head's rotary halves; the
                     inverse permutation is transformers' own);
  config.json        the architecture from the file's metadata;
  tokenizer.json     the vocabulary, merges and special tokens, for HF
                     `tokenizers` and keel alike;
  chat_template.jinja  the chat template as the file carries it.
A file that is not a readable llama GGUF is an error naming it (exit 2).
"""
import json
import os
import sys

import numpy as np


def fail(path, why):
    print(f"convert-gguf: {path}: {why}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    src, out = sys.argv[1], sys.argv[2]
    import gguf
    from safetensors.numpy import save_file

    try:
        reader = gguf.GGUFReader(src)
    except Exception as e:  # the reader raises many kinds on a damaged file
        fail(src, f"not a readable GGUF file ({type(e).__name__}: {e})")

    def field(name, default=None):
        f = reader.fields.get(name)
        if f is None:
            if default is None:
                fail(src, f"metadata {name} is missing")
            return default
        return f.contents()

    arch = field("general.architecture")
    if arch != "llama":
        fail(src, f"architecture {arch!r} is not llama")
    heads = int(field("llama.attention.head_count"))
    kv_heads = int(field("llama.attention.head_count_kv"))
    dim = int(field("llama.embedding_length"))
    config = {
        "architecture": "llama",
        "hidden_size": dim,
        "num_hidden_layers": int(field("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(field("llama.rope.dimension_count", dim // heads)),
        "intermediate_size": int(field("llama.feed_forward_length")),
        "rope_theta": float(field("llama.rope.freq_base")),
        "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(field("llama.context_length")),
        "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field("tokenizer.ggml.eos_token_id")),
        "source": os.path.basename(src),
    }

    def unpermute(w, n_head):
        # GGUF stores each head's rotary pairs interleaved; Hugging Face
        # keeps the two halves apart (rotate_half).
        d = w.shape[0] // n_head // 2
        return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    per_layer = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    tensors = {}
    for t in reader.tensors:
        name = names.get(t.name)
        parts = t.name.split(".")
        if name is None and len(parts) == 4 and parts[0] == "blk" and parts[2] in per_layer:
            name = f"model.layers.{parts[1]}.{per_layer[parts[2]]}.{parts[3]}"
        if name is None:
            continue  # e.g. rope_freqs: keel computes the angles itself
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            fail(src, f"tensor {t.name}: cannot dequantize ({type(e).__name__}: {e})")
        w = np.ascontiguousarray(w, dtype=np.float32)
        if parts[-2:-1] == ["attn_q"]:
            w = unpermute(w, heads)
        elif parts[-2:-1] == ["attn_k"]:
            w = unpermute(w, kv_heads)
        tensors[name] = np.ascontiguousarray(w)
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors

    model = field("tokenizer.ggml.model")
    pre = field("tokenizer.ggml.pre", "default")
    if model != "gpt2":
        fail(src, f"tokenizer model {model!r} is not byte-level BPE (gpt2)")
    # SmolLM2's published tokenizer.json: every digit alone, then GPT-2's
    # pattern (llama.cpp's "smollm" pre-tokenizer is the same two steps).
    pre_tokenizers = {
        "gpt2": [],
        "smollm": [{"type": "Digits", "individual_digits": True}],
    }
    if pre not in pre_tokenizers:
        fail(src, f"pre-tokenizer {pre!r} is not one keel implements (gpt2, smollm)")
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    control = int(gguf.TokenType.CONTROL)
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (tok, kind) in enumerate(zip(tokens, types)) if int(kind) == control]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence",
                          "pretokenizers": pre_tokenizers[pre] + [byte_level]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": list(merges)},
    }
    if len(tokenizer["model"]["vocab"]) != len(tokens):
        fail(src, "the vocabulary repeats a token")

    tmp = out
    os.makedirs(tmp, exist_ok=True)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"source": config["source"]})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(field("tokenizer.chat_template", ""))
    print(f"convert-gguf: {len(tensors)} tensors, {len(tokens)} tokens, {len(merges)} merges "
          f"from {os.path.basename(src)}")


if __name__ == "__main__":
    main()
