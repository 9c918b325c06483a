"""What keel's flash route would cost on causal sliding windows with
another plan, on the ATen kernel keel calls
(_scaled_dot_product_flash_attention_for_cpu), B=1 H=4 E=64, float32 or
bfloat16 (docs/benchmarks.md, "Side by side with the peers", where keel
loses):

  masked       keel's plan today: all query blocks of 128 rows in one
               batched call over [q0 - W, q0 + 128) with one additive mask
  split        the window's edge block (a [128, 128] mask), the full blocks
               (no mask) and the diagonal block (the kernel's causal mask),
               each batched in one call, merged by log-sum-exp
  masked_rows  keel's plan with query pieces of R rows instead of 128 (the
               kernel then picks larger query tiles)

    peers-python tests/bench/peers/plan_estimate_window.py L W dtype [R] [split]
"""
import os, sys, time, statistics
import torch
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
L, W = int(sys.argv[1]), int(sys.argv[2])
dtype = getattr(torch, sys.argv[3])
H, E, BS = 4, 64, 128
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, L, E).to(dtype) for _ in range(3))
scale = 1 / E ** 0.5
nb, wb = L // BS, W // BS
ninf = float("-inf")

def blocks(t, first, count, span=BS):
    # [H, count, span, E] view: block i starts at row (first + i) * BS
    return t[0].as_strided((H, count, span, E), (L * E, BS * E, E, 1), (first * BS) * E)

def merge(acc_o, acc_l, o, l):
    m = torch.maximum(acc_l, l)
    w1, w2 = (acc_l - m).exp(), (l - m).exp()
    return (acc_o * w1.unsqueeze(-1) + o * w2.unsqueeze(-1)) / (w1 + w2).unsqueeze(-1), m + (w1 + w2).log()

def split():
    out = torch.empty(H, nb, BS, E, dtype=dtype)
    lse = torch.empty(H, nb, BS)
    o, l = flash(blocks(q, 0, nb), blocks(k, 0, nb), blocks(v, 0, nb), 0.0, True, scale=scale)
    out.copy_(o); lse.copy_(l)
    if wb > 1:  # full blocks: query block qb against keys [qb - wb + 1, qb)
        first = 1
        for qb in range(1, wb):  # the first query blocks see fewer full blocks
            o, l = flash(blocks(q, qb, 1), blocks(k, 0, 1, qb * BS), blocks(v, 0, 1, qb * BS), 0.0, False, scale=scale)
            out[:, qb:qb+1], lse[:, qb:qb+1] = merge(out[:, qb:qb+1], lse[:, qb:qb+1], o, l)
        n = nb - wb
        if n > 0:
            span = (wb - 1) * BS
            o, l = flash(blocks(q, wb, n), blocks(k, 1, n, span), blocks(v, 1, n, span), 0.0, False, scale=scale)
            out[:, wb:], lse[:, wb:] = merge(out[:, wb:], lse[:, wb:], o, l)
    n = nb - wb  # the window's edge block: keys j >= q - W
    if n > 0:
        i = torch.arange(BS)
        mask = torch.zeros(BS, BS, dtype=dtype).masked_fill(i[None, :] < i[:, None], ninf)
        o, l = flash(blocks(q, wb, n), blocks(k, 0, n), blocks(v, 0, n), 0.0, False, attn_mask=mask, scale=scale)
        out[:, wb:], lse[:, wb:] = merge(out[:, wb:], lse[:, wb:], o, l)
    return out.reshape(1, H, L, E)

pos = torch.arange(L)
def masked():
    out = torch.empty(H, nb, BS, E, dtype=dtype)
    span = W + BS
    i, j = torch.arange(BS)[:, None], torch.arange(span)[None, :]
    # query row i of a block at q0 sees key index j of [q0 - W, q0 + BS) iff 0 <= (i + W) - j <= W
    mask = torch.zeros(BS, span, dtype=dtype).masked_fill(~(((i + W - j) >= 0) & ((i + W - j) <= W)), ninf)
    for qb in range(wb):  # leading blocks: keys [0, q0 + BS)
        keys = slice(0, (qb + 1) * BS)
        keep = (pos[qb*BS:(qb+1)*BS, None] >= pos[None, keys]) & (pos[qb*BS:(qb+1)*BS, None] - pos[None, keys] <= W)
        m = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, ninf)
        o, _ = flash(q[:, :, qb*BS:(qb+1)*BS], k[:, :, keys], v[:, :, keys], 0.0, False, attn_mask=m, scale=scale)
        out[:, qb] = o[0]
    n = nb - wb
    o, _ = flash(blocks(q, wb, n), blocks(k, 0, n, span), blocks(v, 0, n, span), 0.0, False, attn_mask=mask, scale=scale)
    out[:, wb:] = o
    return out.reshape(1, H, L, E)

R = int(sys.argv[4]) if len(sys.argv) > 4 else 256
def masked_rows():
    """keel's plan with query pieces of R rows instead of 128."""
    out = torch.empty(1, H, L, E, dtype=dtype)
    span = W + R
    i, j = torch.arange(R)[:, None], torch.arange(span)[None, :]
    mask = torch.zeros(R, span, dtype=dtype).masked_fill(~(((i + W - j) >= 0) & ((i + W - j) <= W)), ninf)
    lead = (W + R - 1) // R  # leading pieces whose key range would start before 0
    for p in range(lead):
        rows = slice(p * R, (p + 1) * R)
        keys = slice(0, (p + 1) * R)
        keep = (pos[rows, None] >= pos[None, keys]) & (pos[rows, None] - pos[None, keys] <= W)
        m = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, ninf)
        o, _ = flash(q[:, :, rows], k[:, :, keys], v[:, :, keys], 0.0, False, attn_mask=m, scale=scale)
        out[:, :, rows] = o
    n = L // R - lead
    qs = q[0].as_strided((H, n, R, E), (L * E, R * E, E, 1), lead * R * E)
    ks = k[0].as_strided((H, n, span, E), (L * E, R * E, E, 1), (lead * R - W) * E)
    vs = v[0].as_strided((H, n, span, E), (L * E, R * E, E, 1), (lead * R - W) * E)
    o, _ = flash(qs, ks, vs, 0.0, False, attn_mask=mask, scale=scale)
    out[0, :, lead * R:] = o.reshape(H, n * R, E)
    return out

keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] <= W)
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep)
other = split if "split" in sys.argv[5:] else masked_rows
for f in (other, masked):
    assert (f().float() - ref).abs().max().item() < 2e-2, f.__name__
ts = {"other": [], "masked": []}
fs = [("other", other), ("masked", masked)]
for r in range(9):
    for name, f in fs[r % 2:] + fs[:r % 2]:
        t0 = time.perf_counter(); f(); ts[name].append((time.perf_counter() - t0) * 1e3)
print(L, W, dtype, {k: round(statistics.median(v), 1) for k, v in ts.items()},
      other.__name__, "R" if other is masked_rows else "", R if other is masked_rows else "",
      "other/masked", round(statistics.median([a / b for a, b in zip(ts["other"], ts["masked"])]), 3))
