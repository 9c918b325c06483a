#!/usr/bin/env python3
"""One contender of tests/bench/peers/smollm2_peers.py in its own process,
answering the protocol keel-generate --bench-serve answers: one request a
line on stdin, one JSON line on stdout.

    prefill N            seconds to prefill N random tokens from an empty cache
    decode CTX STEPS     seconds for STEPS greedy steps (logits and argmax
                         included) after CTX random tokens, whose prefill is
                         not timed

    smollm2_worker.py llama_cpp MODEL.gguf
    smollm2_worker.py transformers MODEL.gguf float32|bfloat16
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
            token = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            self.llm.eval([token])
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
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=os.path.basename(path), dtype=getattr(torch, dtype))
        self.model.eval()
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


def main():
    kind = sys.argv[1]
    runner = LlamaCpp(sys.argv[2]) if kind == "llama_cpp" else Transformers(sys.argv[2], sys.argv[3])
    rng = np.random.default_rng(0)
    print(json.dumps({"ready": True, "rss_mib": rss_mib()}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            if words[0] == "prefill":
                s = runner.prefill(rng.integers(0, runner.vocab, int(words[1])).tolist())
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
