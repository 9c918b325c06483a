"""A small Llama for the server's tests: SmolLM2's tokenizer and chat
template (byte-level BPE, 49,152 tokens, so any UTF-8 prompt works), and
random weights at a width of 64 over 2 blocks (grouped-query, 4 query heads
over 2 KV heads), seeded, so a step takes well under a millisecond and an
ASan build serves thousands of tokens in seconds. Its texts are noise; the
tests compare them with keel-generate's decode of the same model, and
batched with alone, never with prose.

  make_test_model.py OUT_DIR SMOLLM2_DIR
"""

import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

out, smol = sys.argv[1:3]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)

D, LAYERS, HEADS, KV_HEADS, E, F, VOCAB = 64, 2, 4, 2, 16, 128, 49152
config = {
    "architecture": "llama", "hidden_size": D, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": E,
    "intermediate_size": F, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": True, "source": "tests/examples/make_test_model.py (random, seed 0)",
}


def matrix(rows, cols):  # [out, in], as Hugging Face stores a projection
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)


def norm(n):
    return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)


# Embedding rows of norm about 4: the logits (final norm of RMS 1 against
# each row) spread by about 4, so the greedy token leads the next by far
# more than any rounding of a batched step.
tensors = {"model.embed_tokens.weight": (0.5 * rng.standard_normal((VOCAB, D))).astype(np.float32),
           "model.norm.weight": norm(D)}
for layer in range(LAYERS):
    p = f"model.layers.{layer}."
    tensors[p + "input_layernorm.weight"] = norm(D)
    tensors[p + "post_attention_layernorm.weight"] = norm(D)
    tensors[p + "self_attn.q_proj.weight"] = matrix(HEADS * E, D)
    tensors[p + "self_attn.k_proj.weight"] = matrix(KV_HEADS * E, D)
    tensors[p + "self_attn.v_proj.weight"] = matrix(KV_HEADS * E, D)
    tensors[p + "self_attn.o_proj.weight"] = matrix(D, HEADS * E)
    tensors[p + "mlp.gate_proj.weight"] = matrix(F, D)
    tensors[p + "mlp.up_proj.weight"] = matrix(F, D)
    tensors[p + "mlp.down_proj.weight"] = matrix(D, F)
save_file(tensors, os.path.join(out, "model.safetensors"))
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
for name in ("tokenizer.json", "chat_template.jinja"):
    shutil.copyfile(os.path.join(smol, name), os.path.join(out, name))
print(f"make_test_model: {out}: {LAYERS} blocks of width {D}, vocabulary {VOCAB}")
