#!/usr/bin/env python3
"""SmolLM2-135M-Instruct served under load, keel-serve against llama.cpp's
server (issue 44): keel-serve (float32, bfloat16) on the converted model,
llama-server on the same weights written as an F32 GGUF and on the published
Q4_1 file, each with parallel slots for every client (continuous batching,
llama.cpp's default), the same thread count for compute.

Method (as `vllm bench serve --max-concurrency N`, rate inf): for each
concurrency, each contender in turn (the order rotated per round) gets a
fresh server, one warm-up request, then N closed-loop clients take requests
from one seeded list until it is empty: prompts of 16-128 characters of
lower-case words, output lengths exponential with mean 32 within [4, 128],
generated whole (ignore_eos), greedy, streamed with usage. Time to first
token (TTFT): send to the first frame with text; time per output token
(TPOT): (last frame - first frame) / (tokens - 1), per request; throughput:
output tokens over the cell's wall time; peak memory: the server's VmHWM.
The machine's limit is measured in the same run: one stream's decode reads
every weight once per token, so a stream's tokens/s <= read bandwidth /
weight bytes (batching shares each read among the batch).

    scripts/serve-bench.sh [--clients 1,8,32,64] [--rounds N] [--json F]

Prints a Markdown table for docs/serving.md.
"""
import argparse
import http.client
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alternation  # noqa: E402

THREADS = int(os.environ.get("KEEL_BENCH_THREADS", "2"))
# Each server holds the same tokens of cache: llama.cpp's context of
# CTX_PER_SLOT per slot, keel's pages of 16 for CTX_PER_SLOT per client
# (prompts are at most ~40 tokens, outputs 128).
CTX_PER_SLOT = 512


def workload(seed, n):
    """The requests keel-serve-load sends (examples/serve/load.cpp's list)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgk"
    jobs = []
    for _ in range(n):
        length = 16 + rng.randrange(113)
        prompt = ""
        while len(prompt) < length:
            prompt += "".join(rng.choice(letters) for _ in range(1 + rng.randrange(8))) + " "
        u = rng.random()
        jobs.append((prompt[:length], min(128, max(4, int(-32.0 * math.log(1.0 - u))))))
    return jobs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One contender's server process on a port of its own."""

    def __init__(self, name, argv, port, env=None):
        self.name, self.port = name, port
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=env)
        deadline = time.time() + 180
        while True:
            assert self.proc.poll() is None, f"{name} exited at start"
            assert time.time() < deadline, f"{name} did not start within 180 s"
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)

    def peak_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def one_request(port, prompt, max_tokens):
    """A streamed completion: (ttft_s, tpot_s, tokens) or raises."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, f"status {r.status}: {r.read()[:200]!r}"
    first = last = None
    tokens = frames = 0
    done = False
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            done = True
            break
        j = json.loads(payload)
        if j.get("choices") and j["choices"][0].get("text"):
            now = time.perf_counter()
            first = first or now
            last = now
            frames += 1
        if j.get("usage"):
            tokens = j["usage"]["completion_tokens"]
    c.close()
    assert done and first is not None, "the stream ended without [DONE] or text"
    tokens = tokens or frames
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return first - start, tpot, tokens


def run_cell(server, clients, jobs):
    one_request(server.port, "warm up", 4)
    queue = list(jobs)
    lock = threading.Lock()
    samples, errors = [], []

    def client():
        while True:
            with lock:
                if not queue:
                    return
                prompt, max_tokens = queue.pop(0)
            try:
                samples.append(one_request(server.port, prompt, max_tokens))
            except Exception as e:  # noqa: BLE001: reported, and the cell fails
                errors.append(str(e))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    wall = time.perf_counter() - start
    if errors or len(samples) != len(jobs):
        return {"error": errors[0] if errors else "requests left undone"}

    def pct(values, p):
        v = sorted(values)
        rank = p / 100 * (len(v) - 1)
        lo = math.floor(rank)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (rank - lo)

    ttft = [s[0] * 1e3 for s in samples]
    tpot = [s[1] * 1e3 for s in samples if s[2] > 1]
    return {"tokens_per_s": sum(s[2] for s in samples) / wall,
            "ttft_ms": [pct(ttft, 50), pct(ttft, 99)], "tpot_ms": [pct(tpot, 50), pct(tpot, 99)],
            "peak_mib": server.peak_mib(), "requests": len(samples), "wall_s": wall}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keel-serve", required=True)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--model-dir", required=True, help="the converted model (fetch-deps)")
    p.add_argument("--f32-gguf", required=True)
    p.add_argument("--q4-gguf", required=True)
    p.add_argument("--clients", default="1,8,32,64")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json")
    a = p.parse_args()
    import torch
    import gguf
    reader = gguf.GGUFReader(a.q4_gguf)
    params = sum(int(t.n_elements) for t in reader.tensors)
    q4_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    torch.set_num_threads(THREADS)
    w, v = torch.ones(1 << 14, 1 << 14), torch.ones(1 << 14)
    best = min(alternation.timed_ms(lambda: torch.mv(w, v)) for _ in range(5)) / 1e3
    bandwidth = w.numel() * 4 / best / 1e9
    del w, v

    def keel(dtype):
        return lambda n, port: [a.keel_serve, "--model", a.model_dir, "--model-name", "m",
                                "--dtype", dtype, "--threads", str(THREADS), "--port", str(port),
                                "--max-model-len", str(CTX_PER_SLOT),
                                "--pages", str(n * CTX_PER_SLOT // 16)]

    def llama(gguf_path):
        return lambda n, port: [a.llama_server, "-m", gguf_path, "-t", str(THREADS), "-tb",
                                str(THREADS), "-np", str(n), "-c", str(n * CTX_PER_SLOT),
                                "--host", "127.0.0.1", "--port", str(port), "--no-webui"]

    contenders = [("keel float32", keel("float32"), params * 4),
                  ("keel bfloat16", keel("bfloat16"), params * 2),
                  ("llama.cpp F32", llama(a.f32_gguf), params * 4),
                  ("llama.cpp Q4_1", llama(a.q4_gguf), q4_bytes)]
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    results = {}
    for n in [int(c) for c in a.clients.split(",")]:
        jobs = workload(a.seed, max(2 * n, 16))
        for r in range(a.rounds):
            for name, argv, _ in alternation.rotated(contenders, r):
                port = free_port()
                server = Server(name, argv(n, port), port, env)
                try:
                    cell = run_cell(server, n, jobs)
                finally:
                    server.stop()
                results.setdefault((n, name), []).append(cell)
                print(f"serve_peers: {n:>3} clients, {name:<15} {json.dumps(cell)}", flush=True)
                alternation.pause()

    def med(cells, key, i=None):
        values = [c[key] if i is None else c[key][i] for c in cells if "error" not in c]
        return alternation.median(values) if values else float("nan")

    print(f"\nSmolLM2-135M-Instruct served, {THREADS} threads, read bandwidth {bandwidth:.1f} GB/s "
          f"(one stream's decode limit: {bandwidth * 1e9 / (params * 4):.0f} tokens/s float32, "
          f"{bandwidth * 1e9 / (params * 2):.0f} bfloat16, {bandwidth * 1e9 / q4_bytes:.0f} Q4_1); "
          f"median of {a.rounds} round(s)\n")
    print("| clients | server | tokens/s | vs llama.cpp F32 | TTFT p50 / p99 ms "
          "| TPOT p50 / p99 ms | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for (n, name), cells in results.items():
        if all("error" in c for c in cells):
            print(f"| {n} | {name} | failed: {cells[0]['error']} | | | | |")
            continue
        tps = med(cells, "tokens_per_s")
        ref = med(results.get((n, "llama.cpp F32"), []), "tokens_per_s")
        row = {"clients": n, "server": name, "tokens_per_s": tps, "vs_llama_f32": tps / ref,
               "ttft_ms": [med(cells, "ttft_ms", 0), med(cells, "ttft_ms", 1)],
               "tpot_ms": [med(cells, "tpot_ms", 0), med(cells, "tpot_ms", 1)],
               "peak_mib": med(cells, "peak_mib")}
        rows.append(row)
        print(f"| {n} | {name} | {tps:.0f} | {row['vs_llama_f32']:.2f} | "
              f"{row['ttft_ms'][0]:.0f} / {row['ttft_ms'][1]:.0f} | "
              f"{row['tpot_ms'][0]:.1f} / {row['tpot_ms'][1]:.1f} | {row['peak_mib']:.0f} |")
    if a.json:
        alternation.write_json(a.json, {"machine": alternation.machine(torch), "threads": THREADS,
                                        "bandwidth_gbs": bandwidth, "rows": rows,
                                        "cells": {f"{n} {name}": c
                                                  for (n, name), c in results.items()}})


if __name__ == "__main__":
    main()
