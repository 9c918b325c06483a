#!/usr/bin/env python3
"""One contender of tests/bench/peers/smollm2_peers.py in its own process,
answering the protocol keel-generate --bench-serve answers: one request a
line on stdin, one JSON line on stdout.

    prefill N            seconds to prefill N random tokens from an empty cache
    decode CTX STEPS     seconds for STEPS greedy steps (logits and argmax
                         included) after CTX random tokens, whose prefill is
                         not timed

    tokenize PATH        seconds to encode the file's text (tokenizers only)

    smollm2_worker.py llama_cpp MODEL.gguf
    smollm2_worker.py transformers MODEL.gguf float32|bfloat16
    smollm2_worker.py tokenizers tokenizer.json
"""
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np

THREADS = int(os.environ.get("KEEL_BENCH_THREADS", "2"))


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class LlamaCpp:
    def __init__(self, path):
        from llama_cpp import Llama
        self.llm = Llama(model_path=path, n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS,
                         n_batch=1024, verbose=False)
        self.vocab = self.llm.n_vocab()

    def prefill(self, tokens):
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(tokens)
        return time.perf_counter() - t0

    def decode(self, tokens, steps):
        self.llm.reset()
        self.llm.eval(tokens)
        t0 = time.perf_counter()
        for _ in range(steps):
            # The last token's logits, as llama.cpp's context holds them.
            logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))
            self.llm.eval([int(np.argmax(logits))])
        return time.perf_counter() - t0


class Transformers:
    def __init__(self, path, dtype):
        import torch
        import transformers
        torch.set_num_threads(THREADS)
        self.torch = torch
        # transformers reads the GGUF file alone, in a folder of its own.
        folder = tempfile.mkdtemp()
        os.symlink(os.path.abspath(path), os.path.join(folder, os.path.basename(path)))
        # Loaded in float32 (transformers' advice for GGUF files), then cast:
        # bfloat16 weights and activations, as keel's bfloat16 model.
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=os.path.basename(path), dtype=torch.float32)
        self.model.to(getattr(torch, dtype)).eval()
        self.vocab = self.model.config.vocab_size

    def prefill(self, tokens):
        with self.torch.no_grad():
            t0 = time.perf_counter()
            self.model(self.torch.tensor([tokens]), use_cache=True)
            return time.perf_counter() - t0

    def decode(self, tokens, steps):
        torch = self.torch
        with torch.no_grad():
            out = self.model(torch.tensor([tokens]), use_cache=True)
            t0 = time.perf_counter()
            for _ in range(steps):
                token = out.logits[0, -1].argmax()
                out = self.model(token.view(1, 1), past_key_values=out.past_key_values,
                                 use_cache=True)
            return time.perf_counter() - t0


class Tokenizers:
    """HF tokenizers, one encode call on one thread (as keel's encode)."""

    def __init__(self, path):
        os.environ["RAYON_NUM_THREADS"] = "1"
        import tokenizers
        self.tok = tokenizers.Tokenizer.from_file(path)

    def tokenize(self, path):
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        t0 = time.perf_counter()
        n = len(self.tok.encode(text, add_special_tokens=False).ids)
        return time.perf_counter() - t0, n


def main():
    kind = sys.argv[1]
    if kind == "llama_cpp":
        runner = LlamaCpp(sys.argv[2])
    elif kind == "tokenizers":
        runner = Tokenizers(sys.argv[2])
    else:
        runner = Transformers(sys.argv[2], sys.argv[3])
    rng = np.random.default_rng(0)
    print(json.dumps({"ready": True, "rss_mib": rss_mib()}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            if words[0] == "prefill":
                s = runner.prefill(rng.integers(0, runner.vocab, int(words[1])).tolist())
            elif words[0] == "tokenize":
                s, n = runner.tokenize(words[1])
                print(json.dumps({"seconds": s, "tokens": n, "rss_mib": rss_mib()}), flush=True)
                continue
            elif words[0] == "decode":
                s = runner.decode(rng.integers(0, runner.vocab, int(words[1])).tolist(),
                                  int(words[2]))
            else:
                raise ValueError(f"unknown request {words[0]}")
            print(json.dumps({"seconds": s, "rss_mib": rss_mib()}), flush=True)
        except Exception as e:  # the orchestrator reports it and stops
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
