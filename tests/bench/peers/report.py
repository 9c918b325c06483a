#!/usr/bin/env python3
"""Markdown tables from the JSON files the peer orchestrators wrote, for
docs/benchmarks.md ("Side by side with the peers").

    python3 tests/bench/peers/report.py docs/
"""
import json
import os
import sys

from alternation import geometric_mean, median, median_ci95

MASKS = ["causal", "window256", "window1024", "documents"]


def load(directory, name):
    path = os.path.join(directory, f"peers-{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    # The large loss size runs apart (docs/peers-loss-large.json): one table.
    extra = os.path.join(directory, f"peers-{name}-large.json")
    if name == "loss" and os.path.exists(extra):
        with open(extra) as f:
            data["sizes"] += json.load(f)["sizes"]
    return data


def fmt(x, digits=3):
    return "–" if x is None else f"{x:.{digits}f}"


def attention(data):
    print(f"Machine: {data['machine'].get('cpu')}, {data['machine'].get('cpus')} CPUs, "
          f"torch {data['machine'].get('torch')}, {data['machine'].get('torch_threads')} threads, "
          f"OMP_WAIT_POLICY={data['machine'].get('OMP_WAIT_POLICY')}; B=1 H={data['shape']['H']} E=64\n")
    print("| mask | L | dtype | density | rounds | keel fwd ms | Flex fwd ms | SDPA fwd ms | "
          "**keel / Flex** | keel / SDPA fwd | keel / SDPA fwd+bwd | Flex first call ms | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cases = sorted(data["cases"], key=lambda c: (MASKS.index(c["mask"]), c["dtype"] != "float32", c["L"]))
    for c in cases:
        m, r = c["median_ms"], c["ratios"]
        print(f"| {c['mask']} | {c['L']} | {c['dtype']} | {c['density']:.3f} | {c['rounds']} | "
              f"{m['keel_fwd']:.1f} | {m['flex_fwd']:.1f} | {m['sdpa_fwd']:.1f} | "
              f"**{fmt(r.get('keel/flex fwd'))}** | {fmt(r.get('keel/sdpa fwd'))} | "
              f"{fmt(r.get('keel/sdpa fwd_bwd'))} | {c['flex_first_call_ms']:.0f} | "
              f"{c['load_average'][0]:.1f} |")
    print()


def loss(data):
    names = ["keel", "keel8m", "keel128m", "pt_chunked", "pt_reference", "naive"]
    mine = ["keel", "keel128m"]  # ratio columns; keel8m (the former default) is a row
    for s in data["sizes"]:
        print(f"N={s['N']} D={s['D']} V={s['V']}, rounds "
              f"{len(next(iter(s.get('ms', {'x': []}).values())))}, load at start "
              f"{s['load_average'][0]:.1f}\n")
        present = [m for m in mine if m in s["memory"]]
        print("| contender | median ms | GFLOP/s | peak MiB above inputs | single cold step ms | "
              + " | ".join(f"{m} / it, time | {m} / it, memory" for m in present) + " |")
        print("|---|---|---|---|---|" + "---|---|" * len(present))
        for n in names:
            if n not in s["memory"] and n not in s.get("median_ms", {}):
                continue
            ms = s.get("median_ms", {}).get(n)
            gf = s.get("gflops", {}).get(n)
            mem = s["memory"].get(n, {}).get("peak_bytes")
            cold = s["memory"].get(n, {}).get("ms")
            cells = []
            for m in present:
                if n.startswith("keel"):
                    cells += ["–", "–"]
                else:
                    cells += [fmt(s.get("ratios", {}).get(f"{m}/{n} time")),
                              fmt(s.get("ratios", {}).get(f"{m}/{n} peak memory"))]
            print(f"| {n} | {fmt(ms, 0)} | {fmt(gf, 1)} | {fmt(None if mem is None else mem / 2**20, 1)} | "
                  f"{fmt(cold, 0)} | " + " | ".join(cells) + " |")
        print()


def comm(data):
    for w in data["worlds"]:
        loads = [x[0] for x in w["load_averages"]]
        print(f"{w['world']} ranks, {w['rounds']} rounds of {w['pairs']} pairs, "
              f"load {min(loads):.1f}–{max(loads):.1f}\n")
        print("| bytes | keel µs | raw c10d µs | torch.distributed µs | keel GB/s | raw GB/s | "
              "td GB/s | **keel / raw** | 95% interval | keel / td |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        pooled = []
        for r in w["rows"]:
            u, b = r["median_us"], r["median_bus_GBps"]
            pairs = r["keel/raw_c10d per pair"]
            pooled += pairs
            low, high = median_ci95(pairs)
            print(f"| {r['bytes']} | {u['keel']:.0f} | {u['raw_c10d']:.0f} | {u['torch_distributed']:.0f} | "
                  f"{b['keel']:.3f} | {b['raw_c10d']:.3f} | {b['torch_distributed']:.3f} | "
                  f"**{r['keel/raw_c10d bus bandwidth']:.3f}** | {low:.3f}-{high:.3f} | "
                  f"{r['keel/torch_distributed bus bandwidth']:.3f} |")
        low, high = median_ci95(pooled)
        print(f"\nEvery size, {len(pooled)} pairs: keel / raw median **{median(pooled):.3f}** "
              f"(95% interval {low:.3f}-{high:.3f}), geometric mean {geometric_mean(pooled):.3f}.\n")


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "docs"
    for name, show in (("attention", attention), ("attention-8192-bwd", attention),
                       ("attention-close", attention), ("loss", loss),
                       ("comm", comm)):
        data = load(directory, name)
        if data is not None:
            print(f"### {name}\n")
            show(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
