#!/usr/bin/env python3
"""Writes the references keel's SmolLM2 is tested against (run through
scripts/model-reference.sh, in the peers' environment; on demand, never in CI):

  tokenizer-reference.json   a corpus and, for each text, the ids HF
                             `tokenizers` gives with the converted
                             tokenizer.json; chat conversations and the text
                             transformers' apply_chat_template renders;
  smollm2-reference.safetensors
                             for each prompt: its ids, transformers'
                             float32 logits at its last position, the 32
                             tokens greedy decoding continues it with, and
                             each step's margin (top-1 minus top-2 logit).

    make_reference.py MODEL_DIR OUT_DIR
"""
import base64
import json
import os
import sys
import tempfile
import time

import numpy as np


def corpus():
    """(name, bytes) pairs: one named case per kind of text."""
    cases = []
    with open("/usr/share/common-licenses/GPL-3", "rb") as f:
        cases.append(("gpl3_text", f.read()))
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "make_reference.py"), "rb") as f:
        cases.append(("python_source", f.read()))
    cases += [
        ("cpp_source", b"template <typename T>\nstd::vector<T> f(const T& x) {\n\treturn {x, x};  // twice\n}\n"),
        ("whitespace_runs", b"a  b   c    d\t\te\n\n\nf \n g\r\n  \u00a0h".replace(b"\\u00a0", "\u00a0".encode())),
        ("leading_trailing_space", b"   leading and trailing   "),
        ("only_spaces", b"      "),
        ("empty", b""),
        ("digits", b"1 12 123 1234 12345 3.14159 -42 1e10 0x1F 2026-12-07 10,000,000"),
        ("unicode_numbers", "\u00bd \u00b2 \u2167 \u0663\u0664 \u0968 \u4e09".encode()),
        ("emoji", "Hi \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \u2764\ufe0f!".encode()),
        ("cjk", "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8".encode()),
        ("accents", "Cr\u00e8me br\u00fbl\u00e9e, na\u00efve caf\u00e9, \u0141\u00f3d\u017a, e\u0301 (combining)".encode()),
        ("rtl", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd".encode()),
        ("contractions", b"I'm you're we've they'll she'd it's don't I'M YOU'RE 'tis ''s"),
        ("punctuation", b"Hello, world!!! (really?) [yes] {no} <tag/> @#$%^&*_+=|\\~`"),
        ("control_chars", b"a\x00b\x01c\x1c\x1d\x1e\x1fd\x7f e\x0bf\x0cg"),
        ("url_and_email", b"https://example.com/a?b=c&d=e#f mail@example.org"),
        ("long_word", b"a" * 2000 + b" " + b"ab" * 700),
        ("long_space_run", b" " * 3000 + b"x"),
        ("invalid_utf8_lone_continuation", b"ab\x80cd"),
        ("invalid_utf8_truncated", b"caf\xc3 \xe2\x82 \xf0\x9f\x98"),
        ("invalid_utf8_overlong", b"\xc0\xaf \xe0\x80\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xff\xfe"),
        ("chatml_text", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n".encode()),
    ]
    return cases


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    import torch
    import tokenizers
    import transformers
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    cases = corpus() + [(f"special_{i}", s.encode()) for i, s in enumerate(specials)]
    cases.append(("all_specials_adjacent", "".join(specials).encode()))
    entries = []
    for name, raw in cases:
        text = raw.decode("utf-8", "replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        entries.append({"name": name, "bytes_b64": base64.b64encode(raw).decode(), "text": text,
                        "ids": ids})
    # transformers' own tokenizer for the GGUF file: what its converter
    # builds (its pre-tokenizer may differ; the count is printed, not tested).
    # transformers reads the GGUF file alone (in its own folder, so that
    # nothing keel converted can stand in for it).
    gguf_file = [f for f in os.listdir(model_dir) if f.endswith(".gguf")][0]
    gguf_dir = tempfile.mkdtemp()
    os.symlink(os.path.join(os.path.abspath(model_dir), gguf_file), os.path.join(gguf_dir, gguf_file))
    hf_tok = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    differ = [e["name"] for e in entries
              if hf_tok(base64.b64decode(e["bytes_b64"]).decode("utf-8", "replace"),
                        add_special_tokens=False)["input_ids"] != e["ids"]]
    print(f"make_reference: transformers' GGUF tokenizer differs on {len(differ)} of "
          f"{len(entries)} texts: {differ}")
    conversations = {
        "single_turn": [{"role": "user", "content": "What is the capital of France?"}],
        "single_turn_with_system": [{"role": "system", "content": "You answer in one word."},
                                    {"role": "user", "content": "Capital of Italy?"}],
        "multi_turn_with_system": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Another one, bigger than 100?"}],
        "multi_turn_unicode": [
            {"role": "user", "content": "Traduis \u00ab bonjour \u00bb en \u65e5\u672c\u8a9e."},
            {"role": "assistant", "content": "\u3053\u3093\u306b\u3061\u306f"},
            {"role": "user", "content": "Merci ! \U0001F600"}],
    }
    chats = [{"name": n, "messages": m,
              "rendered": hf_tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)}
             for n, m in conversations.items()]
    with open(os.path.join(out_dir, "tokenizer-reference.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                   "texts": entries, "chats": chats}, f, ensure_ascii=False, indent=0)

    start = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    model.eval()
    print(f"make_reference: {type(model).__name__} loaded in {time.time() - start:.0f} s "
          f"(torch {torch.__version__})")
    prompts = {
        "plain": "The quick brown fox jumps over the lazy dog. The dog",
        "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "chat": chats[0]["rendered"],
        "digits": "Count: 1, 2, 3, 4, 5,",
    }
    tensors = {}
    steps = 32
    with torch.no_grad():
        for name, text in prompts.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            out = model(torch.tensor([ids]), use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
            tensors[f"{name}/prompt"] = torch.tensor(ids, dtype=torch.int64)
            tensors[f"{name}/logits"] = logits.float().clone()
            greedy, margins = [], []
            for _ in range(steps):
                top2 = logits.topk(2)
                greedy.append(int(top2.indices[0]))
                margins.append(float(top2.values[0] - top2.values[1]))
                out = model(torch.tensor([[greedy[-1]]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1]
            tensors[f"{name}/greedy"] = torch.tensor(greedy, dtype=torch.int64)
            tensors[f"{name}/margins"] = torch.tensor(margins, dtype=torch.float32)
            print(f"make_reference: {name}: {len(ids)} prompt tokens -> "
                  f"{tok.decode(greedy)!r} (smallest margin {min(margins):.3g})")
    save_file(tensors, os.path.join(out_dir, "smollm2-reference.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__,
                        "model": gguf_file})


if __name__ == "__main__":
    main()
