#!/usr/bin/env python3
"""keel::attention against flex_attention compiled with torch.compile
(Inductor's CPU template) and against SDPA, on the CPU, in one run.

    $KEEL_DEPS_DIR/peers-venv/bin/peers-python tests/bench/peers/attention_peers.py \
        --out docs/peers-attention.json [--lengths 1024,4096,8192] [--dtypes float32,bfloat16]

For every mask (causal, causal sliding window 256 and 1024, causal document
masking with the document lengths of tests/bench/gpu_bench.cpp), length and
dtype, B=1, H=--heads, E=64, forward:
  keel  keel::attention through build/torch-2.15.0/tests/keel_peer_bench serve
  flex  torch.compile(flex_attention, dynamic=False) with create_block_mask
  sdpa  F.scaled_dot_product_attention: is_causal=True for causal, else the
        equivalent dense boolean mask
and forward+backward for keel and SDPA at --backward-lengths (Flex has no
CPU backward; the gradient flowing in is ones, through torch.autograd.grad
and torch::autograd::grad alike). The
inputs are the same values in both processes (seed 0, the same libtorch
generator). Each configuration gets one untimed warm-up call per contender
(Flex's is its compile, timed and reported as first_call_ms); then every
round gives each contender one turn, the order rotated by one from round to
round: an untimed call, then the timed one. Reported: medians, and ratios
as medians of per-round ratios.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# A fresh Inductor cache: Flex's first call is a cold compile, as for a new
# process on a new machine.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="keel-peers-inductor-"))

from alternation import (DEFAULT_KEEL_BENCH, KeelServer, machine, median, median_ratio,  # noqa: E402
                         pause, rotated, timed_ms, write_json)

DOCUMENT_PATTERN = [2048, 512, 1024, 256, 1536, 768, 2048, 1000]
WINDOWS = {"window256": 256, "window1024": 1024}


def document_ids(length, torch):
    ids, doc = [], 0
    while len(ids) < length:
        n = min(DOCUMENT_PATTERN[doc % len(DOCUMENT_PATTERN)], length - len(ids))
        ids += [doc] * n
        doc += 1
    return torch.tensor(ids, dtype=torch.long)


def mask_mod_and_dense(mask, length, torch):
    pos = torch.arange(length)
    causal_dense = pos[None, :] <= pos[:, None]
    if mask == "causal":
        return (lambda b, h, q, kv: q >= kv), causal_dense
    if mask in WINDOWS:
        w = WINDOWS[mask]
        return ((lambda b, h, q, kv: (q >= kv) & (q - kv <= w)),
                causal_dense & (pos[:, None] - pos[None, :] <= w))
    docs = document_ids(length, torch)
    return ((lambda b, h, q, kv: (q >= kv) & (docs[q] == docs[kv])),
            causal_dense & (docs[:, None] == docs[None, :]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--keel", default=DEFAULT_KEEL_BENCH)
    ap.add_argument("--lengths", default="1024,4096,8192")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--masks", default="causal,window256,window1024,documents")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rounds", default="1024:5,4096:3,8192:3", help="rounds per length")
    ap.add_argument("--backward-lengths", default="1024,4096",
                    help="lengths at which keel and SDPA are also timed forward+backward")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # One compiled function serves every configuration: each is a recompile
    # (new shapes, new mask), more than Dynamo's default limit of 8.
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    flex = torch.compile(flex_attention, dynamic=False)
    rounds_by_length = {int(k): int(v) for k, v in (x.split(":") for x in args.rounds.split(","))}
    keel = KeelServer(args.keel)
    result = {"machine": machine(torch), "shape": {"B": 1, "H": args.heads, "E": 64},
              "command": " ".join(sys.argv), "cases": []}
    for length in (int(x) for x in args.lengths.split(",")):
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for mask in args.masks.split(","):
                torch.manual_seed(0)
                shape = (1, args.heads, length, 64)
                q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
                mod, dense = mask_mod_and_dense(mask, length, torch)
                dense = dense.view(1, 1, length, length)
                case = {"mask": mask, "L": length, "dtype": dtype_name,
                        "density": dense.float().mean().item(),
                        "load_average": os.getloadavg()}
                t0 = time.perf_counter()
                block_mask = create_block_mask(mod, 1, None, length, length, device="cpu")
                case["flex_block_mask_ms"] = (time.perf_counter() - t0) * 1e3

                def sdpa(qq, kk, vv):
                    if mask == "causal":
                        return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
                    return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=dense)

                def flex_fwd():
                    with torch.no_grad():
                        return flex(q, k, v, block_mask=block_mask)

                def sdpa_fwd():
                    with torch.no_grad():
                        return sdpa(q, k, v)

                def sdpa_fwd_bwd():
                    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                    out = sdpa(qg, kg, vg)
                    torch.autograd.grad(out, (qg, kg, vg), torch.ones_like(out))

                request = f"attention {mask} {length} {dtype_name} %s {args.heads}"
                contenders = {
                    "keel_fwd": lambda: keel.request(request % "fwd")["ms"],
                    "flex_fwd": lambda: timed_ms(flex_fwd),
                    "sdpa_fwd": lambda: timed_ms(sdpa_fwd),
                }
                backward = str(length) in args.backward_lengths.split(",")
                if backward:
                    contenders["keel_fwd_bwd"] = lambda: keel.request(request % "fwd_bwd")["ms"]
                    contenders["sdpa_fwd_bwd"] = lambda: timed_ms(sdpa_fwd_bwd)
                # Warm-up, untimed except for Flex's first call (its compile).
                t0 = time.perf_counter()
                out_flex = flex_fwd()
                case["flex_first_call_ms"] = (time.perf_counter() - t0) * 1e3
                case["keel_first_call_ms"] = keel.request(request % "fwd")["ms"]
                out_sdpa = sdpa_fwd()
                case["checksum"] = {"keel": keel.request(request % "fwd")["checksum"],
                                    "flex": out_flex.double().sum().item(),
                                    "sdpa": out_sdpa.double().sum().item()}
                case["max_abs_flex_vs_sdpa"] = (out_flex.float() - out_sdpa.float()).abs().max().item()
                for name, f in contenders.items():
                    if name not in ("keel_fwd", "flex_fwd", "sdpa_fwd"):
                        f()
                names = list(contenders)
                times = {n: [] for n in names}
                for r in range(rounds_by_length.get(length, 3)):
                    for n in rotated(names, r):
                        pause()
                        # An untimed call first: the timed one finds the
                        # cores as back-to-back calls leave them. After the
                        # pause this machine's idle vCPU sleeps, and waking
                        # it costs each parallel region of the first call
                        # (keel, window 256 at L=1024: 5-51 ms, 6.5 warm).
                        contenders[n]()
                        times[n].append(contenders[n]())
                case["rounds"] = len(times["keel_fwd"])
                case["ms"] = times
                case["median_ms"] = {n: median(t) for n, t in times.items()}
                ratios = {"keel/flex fwd": median_ratio(times["keel_fwd"], times["flex_fwd"]),
                          "keel/sdpa fwd": median_ratio(times["keel_fwd"], times["sdpa_fwd"]),
                          "flex/sdpa fwd": median_ratio(times["flex_fwd"], times["sdpa_fwd"])}
                if backward:
                    ratios["keel/sdpa fwd_bwd"] = median_ratio(times["keel_fwd_bwd"],
                                                               times["sdpa_fwd_bwd"])
                case["ratios"] = ratios
                result["cases"].append(case)
                write_json(args.out, result)
                print(f"{mask:10s} L={length:5d} {dtype_name:8s} "
                      f"first call flex {case['flex_first_call_ms']:9.0f} ms | "
                      + " ".join(f"{n} {m:8.1f}" for n, m in case["median_ms"].items())
                      + " | " + " ".join(f"{n} {x:.3f}" for n, x in ratios.items()),
                      flush=True)
                del block_mask, dense, q, k, v, out_flex, out_sdpa
    keel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
