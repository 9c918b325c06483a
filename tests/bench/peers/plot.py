#!/usr/bin/env python3
"""One plot per area from the JSON files the peer orchestrators wrote.

    $KEEL_DEPS_DIR/peers-venv/bin/peers-python tests/bench/peers/plot.py docs/
        (reads docs/peers-{attention,loss,comm}.json, writes docs/peers-*.png)
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from report import load  # noqa: E402  (same folder: the results are read one way)


def attention(data, out):
    cases = data["cases"]
    masks = sorted({c["mask"] for c in cases}, key=["causal", "window256", "window1024", "documents"].index)
    dtypes = sorted({c["dtype"] for c in cases}, reverse=True)
    fig, axes = plt.subplots(len(dtypes), len(masks), figsize=(3.4 * len(masks), 3.2 * len(dtypes)),
                             squeeze=False, sharey=True)
    for i, dtype in enumerate(dtypes):
        for j, mask in enumerate(masks):
            ax = axes[i][j]
            rows = sorted((c for c in cases if c["mask"] == mask and c["dtype"] == dtype),
                          key=lambda c: c["L"])
            lengths = [c["L"] for c in rows]
            for key, label, style in (("keel/flex fwd", "keel / Flex fwd", "o-"),
                                      ("keel/sdpa fwd", "keel / SDPA fwd", "s--"),
                                      ("keel/sdpa fwd_bwd", "keel / SDPA fwd+bwd", "^:")):
                ys = [c["ratios"].get(key) for c in rows]
                if any(y is not None for y in ys):
                    ax.plot(lengths, ys, style, label=label)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(lengths or [1024])
            ax.set_xticklabels([str(x) for x in lengths] or ["1024"])
            ax.set_title(f"{mask}, {dtype}", fontsize=9)
            if i == len(dtypes) - 1:
                ax.set_xlabel("L")
            if j == 0:
                ax.set_ylabel("time ratio (< 1: keel faster)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"keel vs FlexAttention (torch.compile, CPU) and SDPA; B=1 H={data['shape']['H']} E=64; "
                 "median of per-round ratios", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def loss(data, out):
    sizes = data["sizes"]
    names = [n for n in ["keel", "keel8m", "keel128m", "pt_chunked", "pt_reference", "naive"]
             if any(n in s["memory"] for s in sizes)]
    labels = {"keel": "keel\n(default)", "keel8m": "keel\n(8 MiB)", "keel128m": "keel\n(128 MiB)",
              "pt_chunked": "PT 2.13 LCE\nchunked",
              "pt_reference": "PT 2.13 LCE\nreference", "naive": "naive"}
    colors = {"keel": "C0", "keel8m": "C2", "keel128m": "C9", "pt_chunked": "C1", "pt_reference": "C3",
              "naive": "C7"}
    fig, axes = plt.subplots(len(sizes), 2, figsize=(10, 3.3 * len(sizes)), squeeze=False)
    for row, s in zip(axes, sizes):
        xs = range(len(names))
        t = [s.get("median_ms", {}).get(n, float("nan")) / 1e3 for n in names]
        m = [s["memory"].get(n, {}).get("peak_bytes", float("nan")) / 2**20 for n in names]
        row[0].bar(xs, t, color=[colors[n] for n in names])
        row[1].bar(xs, m, color=[colors[n] for n in names])
        for ax, title in ((row[0], "forward+backward, median s (blank: not timed)"),
                          (row[1], "peak resident MiB above inputs")):
            ax.set_xticks(list(xs))
            ax.set_xticklabels([labels[n] for n in names], fontsize=8)
            ax.set_title(f"N={s['N']} D={s['D']} V={s['V']}: {title}", fontsize=9)
    fig.suptitle("fused linear cross-entropy, float32, CPU", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def comm(data, out):
    worlds = data["worlds"]
    fig, axes = plt.subplots(2, len(worlds), figsize=(5.5 * len(worlds), 6.4), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for ax, ratio_ax, w in zip(axes[0], axes[1], worlds):
        xs = [r["bytes"] for r in w["rows"]]
        for key, label, style in (("keel", "keel", "o-"), ("raw_c10d", "raw c10d (C++)", "s--"),
                                  ("torch_distributed", "torch.distributed (Python)", "^:")):
            ax.plot(xs, [r["median_bus_GBps"][key] for r in w["rows"]], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylabel("bus bandwidth (GB/s), median")
        ax.set_title(f"all_reduce, Gloo, {w['world']} ranks on loopback", fontsize=9)
        ax.legend(fontsize=7)
        for key, label, style in (("keel/raw_c10d bus bandwidth", "keel / raw c10d", "o-"),
                                  ("keel/torch_distributed bus bandwidth", "keel / torch.distributed", "^:")):
            ratio_ax.plot(xs, [r[key] for r in w["rows"]], style, label=label)
        ratio_ax.axhline(1.0, color="grey", lw=0.8)
        ratio_ax.axhline(0.97, color="red", lw=0.8, ls="--", label="goal 0.97 (vs raw)")
        ratio_ax.set_xscale("log", base=2)
        ratio_ax.set_xlabel("message size (bytes)")
        ratio_ax.set_ylabel("bus bandwidth ratio")
        ratio_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "docs"
    for name, draw in (("attention", attention), ("loss", loss), ("comm", comm)):
        data = load(directory, name)
        if data is None:
            print(f"plot: no peers-{name}.json in {directory}")
            continue
        path = os.path.join(directory, f"peers-{name}.png")
        draw(data, path)
        print(f"plot: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
