"""What keel's flash route would cost on causal document masking with
another plan, on the ATen kernel keel calls
(_scaled_dot_product_flash_attention_for_cpu), B=1 H=4 E=64, blocks of 128
(docs/benchmarks.md, "Side by side with the peers", where keel loses):

  masked   keel's plan today: per query block one call over [document
           start, diagonal end) with an additive mask (its time matches
           keel_peer_bench's within noise)
  split    the diagonal blocks (causal inside) in one batched call with the
           kernel's own causal mask, plus one unmasked call per query block
           over its earlier full blocks, merged by log-sum-exp
  per_doc  one causal call per document
  rect     split, with each document's strictly lower block triangle
           covered by halving rectangles (queries [m, b) against keys
           [a, m), recursively), each merged by log-sum-exp

    $KEEL_DEPS_DIR/peers-venv/bin/peers-python tests/bench/peers/plan_estimate_documents.py L [dtype]
"""
import os, sys, time, statistics
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_peers import document_ids
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
L, H, E, BS = int(sys.argv[1]), 4, 64, 128
dtype = getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else torch.float32
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, L, E).to(dtype) for _ in range(3))
docs = document_ids(L, torch)
nb = L // BS
start_block = [int(docs[:qb * BS + 1].eq(docs[qb * BS]).nonzero()[0]) // BS for qb in range(nb)]
assert all(int(docs[i * BS]) == int(docs[i * BS + BS - 1]) for i in range(nb)), "boundaries not block-aligned"
scale = 1 / E ** 0.5

def merge(out, lse, rows, o2, l2):
    l1 = lse[:, :, rows]
    m = torch.maximum(l1, l2)
    w1 = (l1 - m).exp(); w2 = (l2 - m).exp()
    out[:, :, rows] = (out[:, :, rows] * w1.unsqueeze(-1) + o2 * w2.unsqueeze(-1)) / (w1 + w2).unsqueeze(-1)
    lse[:, :, rows] = m + (w1 + w2).log()

def diagonal():
    """All diagonal blocks: one call, the kernel's own causal mask."""
    qd = q.view(H, nb, BS, E); kd = k.view(H, nb, BS, E); vd = v.view(H, nb, BS, E)
    o, l = flash(qd, kd, vd, 0.0, True, scale=scale)
    return o.reshape(1, H, L, E).clone(), l.reshape(1, H, L).clone()

def split():
    out, lse = diagonal()
    for qb in range(nb):
        sb = start_block[qb]
        if sb == qb:
            continue
        rows = slice(qb * BS, qb * BS + BS)
        o2, l2 = flash(q[:, :, rows], k[:, :, sb * BS: qb * BS], v[:, :, sb * BS: qb * BS], 0.0, False, scale=scale)
        merge(out, lse, rows, o2, l2)
    return out

def rectangles(a, b, acc):
    """Blocks (q0, q1, k0, k1) covering the strictly lower block triangle of [a, b)."""
    if b - a < 2:
        return
    m = (a + b) // 2
    acc.append((m, b, a, m))
    rectangles(a, m, acc)
    rectangles(m, b, acc)

def rect():
    out, lse = diagonal()
    acc = []
    starts = sorted(set(start_block)) + [nb]
    for a, b in zip(starts, starts[1:]):
        rectangles(a, b, acc)
    for q0, q1, k0, k1 in acc:
        rows = slice(q0 * BS, q1 * BS)
        o2, l2 = flash(q[:, :, rows], k[:, :, k0 * BS: k1 * BS], v[:, :, k0 * BS: k1 * BS], 0.0, False, scale=scale)
        merge(out, lse, rows, o2, l2)
    return out

def per_doc():
    """One call per document over its own rows and keys, the kernel's own
    causal mask (top-left is right: a document's queries and keys start at
    the same position)."""
    out = torch.empty_like(q)
    bounds = [0] + [i for i in range(1, L) if docs[i] != docs[i - 1]] + [L]
    for a, b in zip(bounds, bounds[1:]):
        o, _ = flash(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], 0.0, True, scale=scale)
        out[:, :, a:b] = o
    return out

def masked():
    """keel's present plan for this mask: one call per query block over
    [doc start, diagonal end) with an additive mask."""
    out = torch.empty_like(q)
    pos = torch.arange(L)
    for qb in range(nb):
        sb = start_block[qb]
        rows = slice(qb * BS, qb * BS + BS)
        keys = slice(sb * BS, qb * BS + BS)
        keep = (pos[rows, None] >= pos[None, keys]) & (docs[rows, None] == docs[None, keys])
        mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
        o, _ = flash(q[:, :, rows], k[:, :, keys], v[:, :, keys], 0.0, False, attn_mask=mask, scale=scale)
        out[:, :, rows] = o
    return out

ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
        attn_mask=(torch.arange(L)[:, None] >= torch.arange(L)[None, :]) & (docs[:, None] == docs[None, :]))
names = ("split", "masked", "per_doc", "rect")
fs = [(n, globals()[n]) for n in names]
for name, f in fs:
    print(name, "max err", (f().float() - ref).abs().max().item())
ts = {n: [] for n in names}
for r in range(7):
    for name, f in fs[r % len(fs):] + fs[:r % len(fs)]:
        t0 = time.perf_counter(); f(); ts[name].append((time.perf_counter() - t0) * 1e3)
print(L, dtype, {k: round(statistics.median(v), 1) for k, v in ts.items()},
      " ".join(f"{n}/masked {statistics.median([a / b for a, b in zip(ts[n], ts['masked'])]):.3f}"
               for n in names if n != "masked"),
      f"rect/split {statistics.median([a / b for a, b in zip(ts['rect'], ts['split'])]):.3f}")
