#!/usr/bin/env python3
"""FlexAttention's side of scripts/gpu-check.sh: the attention cases of
tests/bench/gpu_bench.cpp (bf16, B=1, H=16, L=8192, E=128; a causal sliding
window of 1024 and causal document masking with the same document lengths),
timed with torch.compile(flex_attention), and SDPA with the same dense boolean
mask for a cross-check of the C++ figures. Writes one JSON object.

    python3 tests/bench/flex_bench.py --out flex.json [--quick]
    python3 tests/bench/flex_bench.py --check   # imports and argument parsing only
"""
import argparse
import json
import statistics
import sys
import time

# The same list as document_ids() in gpu_bench.cpp.
DOCUMENT_PATTERN = [2048, 512, 1024, 256, 1536, 768, 2048, 1000]


def document_ids(length, torch, device):
    ids, doc, pos = [], 0, 0
    while pos < length:
        n = min(DOCUMENT_PATTERN[doc % len(DOCUMENT_PATTERN)], length - pos)
        ids += [doc] * n
        pos += n
        doc += 1
    return torch.tensor(ids, dtype=torch.long, device=device)


def median_ms(torch, f, warmup, iters):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        print("flex_bench: arguments parse; torch is not imported by --check")
        return 0

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch.nn.functional as F

    result = {"torch_version": torch.__version__, "cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        result["error"] = "no CUDA device visible to torch"
        print(json.dumps(result, indent=2))
        return 3
    dev = "cuda"
    B, H, L, E, W = 1, 16, (2048 if args.quick else 8192), 128, 1024
    warmup, iters = (1, 3) if args.quick else (3, 10)
    result["device_name"] = torch.cuda.get_device_name(0)
    result["shape"] = {"B": B, "H": H, "L": L, "E": E, "dtype": "bfloat16"}
    torch.manual_seed(0)
    q, k, v, up = (torch.randn(B, H, L, E, device=dev, dtype=torch.bfloat16) for _ in range(4))
    docs = document_ids(L, torch, dev)
    pos = torch.arange(L, device=dev)

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= W)

    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])

    dense = {
        "sliding_window_1024": ((pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] <= W)),
        "document_causal": ((pos[None, :] <= pos[:, None]) & (docs[:, None] == docs[None, :])),
    }
    flex = torch.compile(flex_attention, dynamic=False)
    for name, mod in (("sliding_window_1024", sliding), ("document_causal", document_causal)):
        r = {}
        t0 = time.perf_counter()
        bm = create_block_mask(mod, B, None, L, L, device=dev)
        r["block_mask_build_ms"] = (time.perf_counter() - t0) * 1e3
        mask = dense[name].view(1, 1, L, L)

        def flex_fwd(qq, kk, vv):
            return flex(qq, kk, vv, block_mask=bm)

        def sdpa_fwd(qq, kk, vv):
            return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)

        def fwd_bwd(fwd):
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            torch.autograd.grad(fwd(qg, kg, vg), (qg, kg, vg), up)

        t0 = time.perf_counter()
        with torch.no_grad():
            flex_fwd(q, k, v)
        fwd_bwd(flex_fwd)
        torch.cuda.synchronize()
        r["flex_compile_ms"] = (time.perf_counter() - t0) * 1e3
        with torch.no_grad():
            r["flex_forward_ms"] = median_ms(torch, lambda: flex_fwd(q, k, v), warmup, iters)
            r["sdpa_dense_mask_forward_ms"] = median_ms(torch, lambda: sdpa_fwd(q, k, v), warmup, iters)
            a, b = flex_fwd(q, k, v).float(), sdpa_fwd(q, k, v).float()
            r["max_abs_difference_flex_vs_sdpa"] = (a - b).abs().max().item()
        r["flex_forward_backward_ms"] = median_ms(torch, lambda: fwd_bwd(flex_fwd), warmup, iters)
        r["sdpa_dense_mask_forward_backward_ms"] = median_ms(
            torch, lambda: fwd_bwd(sdpa_fwd), warmup, iters)
        result[name] = r
        print(f"flex_bench: {name} {json.dumps(r)}", file=sys.stderr)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
