#!/usr/bin/env python3
"""SmolLM2-135M-Instruct, one stream, keel against the CPU anchors (issue 43):
keel's model (float32, bfloat16), llama.cpp on the same weights written as
an F32 GGUF and on the published Q4_1 file, and transformers' eager model
(float32, bfloat16) on the same torch release as keel's build. Every
contender runs in its own process with the same thread count; rounds
alternate them (rotated each round), and each figure is the median over
rounds. The machine's limit is measured in the same run: decoding reads
every weight once per token, so tokens/s <= read bandwidth / weight bytes.

    scripts/model-bench.sh [--rounds N] [--json F]

(which builds keel and the llama.cpp peer first). Prints a Markdown table
for docs/benchmarks.md.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alternation  # noqa: E402

REPO = alternation.REPO

THREADS = int(os.environ.get("KEEL_BENCH_THREADS", "2"))
METRICS = [("prefill 128", "prefill 128", 128), ("prefill 1024", "prefill 1024", 1024),
           ("decode ctx 128", "decode 128 32", 32), ("decode ctx 2048", "decode 2048 32", 32)]


class Worker(alternation.KeelServer):
    """A contender's process (the protocol of keel-generate --bench-serve),
    with the bytes of weights its decoding reads per token."""

    def __init__(self, name, argv, weight_bytes):
        env = dict(os.environ, KEEL_BENCH_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS))
        super().__init__(argv=argv, name=name, env=env)
        self.weight_bytes = weight_bytes
        self.read("start")  # {"ready": true}


def read_bandwidth_gbs(torch):
    """Read bandwidth as decoding meets it: the best of 5 matrix-vector
    products over a 1 GiB float32 matrix (far larger than any cache), on
    THREADS threads. (A plain sum reads slower here: 27.5 GB/s against 32.9.)"""
    torch.set_num_threads(THREADS)
    w = torch.ones(1 << 14, 1 << 14)
    v = torch.ones(1 << 14)
    best = min(alternation.timed_ms(lambda: torch.mv(w, v)) for _ in range(5)) / 1e3
    return w.numel() * 4 / best / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keel", required=True, help="keel-generate")
    p.add_argument("--model-dir", required=True, help="the converted model (fetch-deps)")
    p.add_argument("--f32-gguf", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    import torch
    q4 = [f for f in os.listdir(a.model_dir) if f.endswith(".gguf")][0]
    q4 = os.path.join(a.model_dir, q4)
    import gguf
    reader = gguf.GGUFReader(q4)
    params = sum(int(t.n_elements) for t in reader.tensors)
    q4_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_worker.py")
    py = sys.executable
    contenders = [
        Worker("keel float32", [a.keel, "--model", a.model_dir, "--threads", str(THREADS),
                                "--bench-serve"], params * 4),
        Worker("keel bfloat16", [a.keel, "--model", a.model_dir, "--threads", str(THREADS),
                                 "--dtype", "bfloat16", "--bench-serve"], params * 2),
        Worker("llama.cpp F32", [py, worker, "llama_cpp", a.f32_gguf], params * 4),
        Worker("llama.cpp Q4_1", [py, worker, "llama_cpp", q4], q4_bytes),
        Worker("transformers float32", [py, worker, "transformers", a.f32_gguf, "float32"],
               params * 4),
        Worker("transformers bfloat16", [py, worker, "transformers", a.f32_gguf, "bfloat16"],
               params * 2),
    ]
    times = {(c.name, m[0]): [] for c in contenders for m in METRICS}
    rss = {c.name: 0.0 for c in contenders}
    bandwidth = []
    for r in range(a.rounds):
        for label, request, _ in METRICS:
            for c in alternation.rotated(contenders, r):
                alternation.pause()
                answer = c.request(request)
                times[(c.name, label)].append(answer["seconds"])
                rss[c.name] = max(rss[c.name], answer["rss_mib"])
        alternation.pause()
        bandwidth.append(read_bandwidth_gbs(torch))
        print(f"smollm2_peers: round {r + 1} of {a.rounds} done", file=sys.stderr)
    # The tokenizer: keel's (in keel float32's process) against HF
    # tokenizers, each encoding one corpus file on one thread.
    corpus = os.path.join(tempfile.mkdtemp(), "corpus.txt")
    with open(corpus, "wb") as f:
        for path in ["/usr/share/common-licenses/GPL-3"] + sorted(
                os.path.join(REPO, "docs", d) for d in os.listdir(os.path.join(REPO, "docs"))
                if d.endswith(".md")):
            with open(path, "rb") as g:
                f.write(g.read())
    corpus_bytes = os.path.getsize(corpus)
    hf = Worker("HF tokenizers", [py, worker, "tokenizers",
                                  os.path.join(a.model_dir, "tokenizer.json")], 0)
    tokenizers = [contenders[0], hf]
    tok_s = {c.name: [] for c in tokenizers}
    tok_n = {}
    for r in range(a.rounds):
        for c in alternation.rotated(tokenizers, r):
            alternation.pause()
            answer = c.request(f"tokenize {corpus}")
            tok_s[c.name].append(answer["seconds"])
            tok_n[c.name] = answer["tokens"]
    hf.close()
    if len(set(tok_n.values())) != 1:
        raise SystemExit(f"smollm2_peers: the tokenizers disagree on the corpus: {tok_n}")
    for c in contenders:
        c.close()
    bw = alternation.median(bandwidth)
    rate = {}
    for (name, label), ts in times.items():
        n = next(m[2] for m in METRICS if m[0] == label)
        rate[(name, label)] = n / alternation.median(ts)
    lines = [f"Read bandwidth {bw:.1f} GB/s (median of {a.rounds}); {THREADS} threads; "
             f"torch {torch.__version__} for transformers; {alternation.machine().get('cpu', '?')}.",
             "",
             "| contender | prefill 128 tok/s | prefill 1024 tok/s | decode ctx 128 tok/s | "
             "decode ctx 2048 tok/s | decode limit tok/s (bandwidth / weights) | peak RSS MiB |",
             "|---|---|---|---|---|---|---|"]
    for c in contenders:
        cells = " | ".join(f"{rate[(c.name, m[0])]:.1f}" for m in METRICS)
        lines.append(f"| {c.name} | {cells} | {bw * 1e9 / c.weight_bytes:.1f} | {rss[c.name]:.0f} |")
    ratios = []
    for keel_name, peer in (("keel float32", "llama.cpp F32"), ("keel bfloat16", "llama.cpp F32"),
                            ("keel float32", "transformers float32"),
                            ("keel bfloat16", "transformers bfloat16"),
                            ("keel bfloat16", "keel float32")):
        cells = ", ".join(f"{m[0]} {rate[(keel_name, m[0])] / rate[(peer, m[0])]:.2f}"
                          for m in METRICS)
        ratios.append(f"- {keel_name} / {peer}: {cells}")
    mbs = {n: corpus_bytes / alternation.median(ts) / 1e6 for n, ts in tok_s.items()}
    tokenizer_line = (f"Tokenizer, one thread, {corpus_bytes / 1e6:.2f} MB of text (the GPL and "
                      f"keel's docs, {tok_n['HF tokenizers']} tokens, equal counts): keel "
                      f"{mbs['keel float32']:.1f} MB/s, HF tokenizers {mbs['HF tokenizers']:.1f} "
                      f"MB/s (ratio {mbs['keel float32'] / mbs['HF tokenizers']:.2f}).")
    text = "\n".join(lines + ["", "Ratios (medians of each contender's rounds):"] + ratios +
                     ["", tokenizer_line])
    print(text)
    if a.json:
        alternation.write_json(a.json, {
            "machine": alternation.machine(torch), "threads": THREADS, "rounds": a.rounds,
            "read_bandwidth_gbs": bandwidth,
            "seconds": {f"{n} / {l}": ts for (n, l), ts in times.items()},
            "tokens_per_s": {f"{n} / {l}": v for (n, l), v in rate.items()},
            "peak_rss_mib": rss, "tokenizer_seconds": tok_s, "corpus_bytes": corpus_bytes,
            "table": text})


if __name__ == "__main__":
    main()
