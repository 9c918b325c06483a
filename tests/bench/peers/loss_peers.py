#!/usr/bin/env python3
"""keel::linear_cross_entropy against PyTorch 2.13's
torch.nn.functional.linear_cross_entropy and the naive loss, float32 on the
CPU, forward+backward: time and peak memory, in one run.

    $KEEL_DEPS_DIR/peers-venv/bin/peers-python tests/bench/peers/loss_peers.py \
        --out docs/peers-loss.json [--sizes 4096x1024x32768,8192x2048x128256] [--rounds 5]

Contenders (hidden [N, D] and weight [V, D] require grad, target [N] int64,
reduction mean):
  keel          keel::linear_cross_entropy (auto dispatch: keel's chunked
                kernel), through build/torch-2.15.0/tests/keel_peer_bench, default
                options (the automatic working-set budget: an eighth of the
                gradients, at least 8 MiB; docs/peers-loss*.json were taken
                when the default was 8 MiB, as keel8m would be today)
  keel<M>m      the same with LinearCrossEntropyOptions::chunk_budget_bytes = M MiB
                (e.g. keel64m)
  pt_chunked    F.linear_cross_entropy(h, W, y, options=LinearCrossEntropyOptions()),
                2.13's chunked path with its default (auto) options
  pt_reference  F.linear_cross_entropy(h, W, y), options=None: 2.13's
                default, the reference path that materialises the logits
  naive         F.cross_entropy(F.linear(h, W), y)

Time: one untimed warm-up each, then every round runs every contender once
in an order rotated by one from round to round; medians, and ratios as
medians of per-round ratios. The inputs are the same values in both
processes (seed 0, the same libtorch generator).

Peak memory: every contender runs one forward+backward in a fresh process
of its own; after the inputs exist, VmHWM is reset to the current resident
size (writing 5 to /proc/self/clear_refs) and the figure is VmHWM after the
step minus VmRSS before it: what the step added to resident memory at its
peak, gradients dX and dW included. The same measure for the C++ and the
Python processes.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from alternation import (DEFAULT_KEEL_BENCH, KeelServer, machine, median, median_ratio,  # noqa: E402
                         pause, rotated, timed_ms, write_json)

PYTHON_CONTENDERS = ("pt_chunked", "pt_reference", "naive")


def keel_budget(name):
    """None for a Python contender; else keel's chunk budget in bytes (0: default)."""
    if not name.startswith("keel"):
        return None
    return int(name[4:-1]) << 20 if name.endswith("m") else 0


def inputs(n, d, v, torch):
    torch.manual_seed(0)
    hidden = torch.randn(n, d).requires_grad_(True)
    weight = (torch.randn(v, d) * 0.05).requires_grad_(True)
    target = torch.randint(0, v, (n,), dtype=torch.long)
    return hidden, weight, target


def step_function(name, torch):
    import torch.nn.functional as F
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    options = LinearCrossEntropyOptions()

    def step(h, w, y):
        if name == "pt_chunked":
            loss = F.linear_cross_entropy(h, w, y, options=options)
        elif name == "pt_reference":
            loss = F.linear_cross_entropy(h, w, y)
        else:
            loss = F.cross_entropy(F.linear(h, w), y)
        loss.backward()
        h.grad = None
        w.grad = None
    return step


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def memory_one(name, n, d, v):
    """The child process of one Python contender's memory measurement."""
    import torch
    h, w, y = inputs(n, d, v, torch)
    step = step_function(name, torch)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_kib("VmRSS")
    t0 = time.perf_counter()
    step(h, w, y)
    ms = (time.perf_counter() - t0) * 1e3
    print(json.dumps({"peak_bytes": (status_kib("VmHWM") - base) * 1024, "base_bytes": base * 1024,
                      "ms": ms}))


def measure_memory(name, n, d, v, keel_path, timeout):
    if keel_budget(name) is not None:
        cmd = [keel_path, "loss-memory", str(n), str(d), str(v), str(keel_budget(name))]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--memory-one", name, "--sizes", f"{n}x{d}x{v}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--keel", default=DEFAULT_KEEL_BENCH)
    ap.add_argument("--sizes", default="4096x1024x32768,8192x2048x128256")
    ap.add_argument("--rounds", default="5", help="R, or per size: 4096x1024x32768:5,...")
    ap.add_argument("--contenders", default="keel,pt_chunked,pt_reference,naive")
    ap.add_argument("--timed-contenders", default=None,
                    help="per size, which contenders are timed (default: all), e.g. "
                         "8192x2048x128256:keel+pt_chunked")
    ap.add_argument("--memory-one", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    if args.memory_one:
        memory_one(args.memory_one, *sizes[0])
        return 0

    import torch
    rounds = {}
    for item in args.rounds.split(","):
        key, _, val = item.rpartition(":")
        rounds[key or "*"] = int(val)
    timed = {}
    for item in (args.timed_contenders or "").split(","):
        if item:
            key, val = item.split(":")
            timed[key] = val.split("+")
    all_names = args.contenders.split(",")
    result = {"machine": machine(torch), "command": " ".join(sys.argv), "sizes": []}
    keel = KeelServer(args.keel)
    for n, d, v in sizes:
        key = f"{n}x{d}x{v}"
        entry = {"N": n, "D": d, "V": v, "load_average": os.getloadavg(), "memory": {}}
        result["sizes"].append(entry)
        # Memory first: fresh processes, one at a time, nothing else of ours resident.
        for name in all_names:
            entry["memory"][name] = measure_memory(name, n, d, v, args.keel, args.timeout)
            print(f"{key} memory {name:12s} peak {entry['memory'][name]['peak_bytes'] / 2**20:9.1f} MiB "
                  f"(its single step {entry['memory'][name]['ms']:.0f} ms)", flush=True)
            write_json(args.out, result) if args.out else None
        names = timed.get(key, all_names)
        h, w, y = inputs(n, d, v, torch)
        steps = {name: step_function(name, torch) for name in names if keel_budget(name) is None}
        contenders = {}
        for name in names:
            if keel_budget(name) is not None:
                contenders[name] = (lambda b=keel_budget(name):
                                    keel.request(f"loss {n} {d} {v} {b}")["ms"])
            else:
                contenders[name] = (lambda s=steps[name]: timed_ms(lambda: s(h, w, y)))
        for f in contenders.values():  # warm-up
            f()
        times = {name: [] for name in names}
        for r in range(rounds.get(key, rounds.get("*", 5))):
            for name in rotated(names, r):
                pause()
                times[name].append(contenders[name]())
            print(f"{key} round {r + 1}: " + " ".join(f"{k} {t[-1]:.0f} ms" for k, t in times.items()),
                  flush=True)
        entry["ms"] = times
        entry["median_ms"] = {k: median(t) for k, t in times.items()}
        entry["gflops"] = {k: 6.0 * n * d * v / (m / 1e3) / 1e9 for k, m in entry["median_ms"].items()}
        ratios = {}
        for mine in (x for x in all_names if keel_budget(x) is not None):
            for other in (x for x in names if keel_budget(x) is None):
                if mine in times:
                    ratios[f"{mine}/{other} time"] = median_ratio(times[mine], times[other])
            for other in (x for x in all_names if keel_budget(x) is None):
                ratios[f"{mine}/{other} peak memory"] = (entry["memory"][mine]["peak_bytes"]
                                                         / entry["memory"][other]["peak_bytes"])
        entry["ratios"] = ratios
        entry["load_average_end"] = os.getloadavg()
        print(f"{key}: " + " ".join(f"{k} {x:.3f}" for k, x in ratios.items()), flush=True)
        if args.out:
            write_json(args.out, result)
        del h, w, y
        keel.request("drop")
    keel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
