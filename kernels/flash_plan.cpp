#include "flash_plan.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

namespace keel::kernels {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
constexpr std::int64_t kDefaultBlock = 128;

// One call of the kernel with its own top-left causal mask over the whole
// of batches [b0, b0 + nb).
FlashGroup whole_causal_call(std::int64_t b0, std::int64_t nb, const MaskGeometry& g) {
  FlashGroup group;
  group.b0 = b0;
  group.nb = nb;
  group.rows = group.q_step = g.q_len;
  group.len = group.k_step = g.kv_len;
  group.causal = true;
  return group;
}

// Whether every term is a rule on positions alone, the same for every batch.
bool positional(const AttentionSpec& spec) {
  for (const Mask& m : spec.masks) {
    if (m.kind != MaskKind::causal && m.kind != MaskKind::sliding_window &&
        m.kind != MaskKind::chunked_causal) {
      return false;
    }
  }
  return true;
}

// Whether every term depends on key and query position through j - p only:
// then a tile's mask is fixed by (q0 - k0, rows, len).
bool translation_invariant(const AttentionSpec& spec) {
  for (const Mask& m : spec.masks) {
    if (m.kind != MaskKind::causal && m.kind != MaskKind::sliding_window) return false;
  }
  return true;
}

// The terms of `spec` restricted to batch b (for data-driven terms).
AttentionSpec batch_slice(const AttentionSpec& spec, std::int64_t b) {
  AttentionSpec out = spec;
  const auto slice = [b](at::Tensor& t) {
    if (t.defined() && t.dim() > 0 && t.size(0) > 1) t = t.narrow(0, b, 1);
  };
  for (Mask& m : out.masks) {
    slice(m.prefix_lengths);
    slice(m.q_document_ids);
    slice(m.kv_document_ids);
    slice(m.kv_lengths);
    slice(m.block.kv_num_blocks);
    slice(m.block.kv_indices);
    slice(m.block.full_kv_num_blocks);
    slice(m.block.full_kv_indices);
    if (m.tensor.defined() && m.tensor.dim() == 4) slice(m.tensor);
  }
  return out;
}

// The run index of a diagonal cut off its range: after every other run.
constexpr std::int64_t kDiagonalRun = std::numeric_limits<std::int64_t>::max();

// One contiguous range of visible keys of one query segment.
struct Piece {
  std::int64_t q0 = 0;
  std::int64_t rows = 0;
  std::int64_t k0 = 0;
  std::int64_t len = 0;
  std::int64_t run = 0;       // index of the range within its query block
  std::int64_t mask_id = -1;  // pieces of equal mask_id share one mask; -1: none
  bool causal = false;        // a diagonal block served by the kernel's causal flag
  at::Tensor mask;
  at::Tensor nonempty;
};

// The masks of partial pieces, in the layout the kernel broadcasts.
struct TileMask {
  at::Tensor additive;
  at::Tensor nonempty;  // undefined when every row sees a key
};

TileMask tile_mask(const AttentionSpec& spec, const MaskGeometry& g, const Piece& p,
                   at::ScalarType dtype) {
  const at::Tensor keys = at::arange(p.k0, p.k0 + p.len, at::TensorOptions().dtype(at::kLong));
  at::Tensor keep = materialize_tile(spec, g, p.q0, p.rows, keys);
  if (keep.size(0) != 1 || keep.size(1) != 1) {
    keep = keep.expand({g.batch, g.q_heads, p.rows, p.len})
               .reshape({g.batch * g.q_heads, 1, p.rows, p.len});
  } else {
    keep = keep.view({p.rows, p.len});
  }
  TileMask t;
  t.additive = at::zeros(keep.sizes(), at::TensorOptions().dtype(dtype))
                   .masked_fill_(keep.logical_not(), kMinusInf);
  at::Tensor nonempty = keep.any(-1);
  if (!nonempty.all().item<bool>()) {
    // Broadcastable to [nb * Hq, count, rows].
    t.nonempty = nonempty.dim() == 1 ? nonempty.view({1, 1, p.rows}) : nonempty;
  }
  return t;
}

// The calls of the flash route for batches [b0, b0 + nb) under `spec`.
void plan_batches(const AttentionSpec& spec, const MaskGeometry& g, std::int64_t b0,
                  at::ScalarType dtype, std::vector<FlashGroup>& groups) {
  // Plain variables, not a structured binding: the lambdas below capture them.
  const std::pair<std::int64_t, std::int64_t> sizes = block_sizes(spec);
  const std::int64_t bq = sizes.first;
  const std::int64_t bk = sizes.second;
  const std::int64_t q_blocks = block_count(g.q_len, bq);
  const std::int64_t kv_blocks = block_count(g.kv_len, bk);
  const BlockClasses classes = classify_blocks(spec, g, at::kCPU, bq, bk);
  const auto visible = classes.visible.accessor<bool, 2>();
  const auto full = classes.full.accessor<bool, 2>();

  // Per query block, its ranges of visible key blocks: [kb0, kb1), partial?
  struct Run {
    std::int64_t kb0, kb1;
    bool partial;
    bool operator==(const Run& o) const {
      return kb0 == o.kb0 && kb1 == o.kb1 && partial == o.partial;
    }
  };
  // Whether the diagonal block of query block qb is visible exactly as its
  // lower triangle (key j sees query i iff j <= i within the block), so that
  // the kernel's own causal flag serves it without a mask. Each block's
  // tile is materialised at most once: both uses below ask.
  std::vector<std::int8_t> diagonal_known(static_cast<std::size_t>(q_blocks), -1);
  const auto causal_diagonal = [&](std::int64_t qb) {
    std::int8_t& known = diagonal_known[static_cast<std::size_t>(qb)];
    if (known >= 0) return known == 1;
    const std::int64_t q0 = qb * bq;
    const std::int64_t rows = std::min(bq, g.q_len - q0);
    bool causal = bq == bk && qb < kv_blocks && visible[qb][qb] && !full[qb][qb] &&
                  rows == std::min(bk, g.kv_len - q0);
    if (causal) {
      const at::Tensor keys = at::arange(q0, q0 + rows, at::TensorOptions().dtype(at::kLong));
      const at::Tensor keep = materialize_tile(spec, g, q0, rows, keys);
      causal = keep.size(0) == 1 && keep.size(1) == 1 &&
               at::equal(keep.view({rows, rows}), at::ones({rows, rows}, keep.options()).tril());
    }
    known = causal ? 1 : 0;
    return causal;
  };

  // A mask that is plain top-left causal in disguise (a window or documents
  // at least as long as the sequence): one call with the kernel's causal flag.
  bool causal_everywhere = g.q_len == g.kv_len && bq == bk;
  for (std::int64_t qb = 0; causal_everywhere && qb < q_blocks; ++qb) {
    for (std::int64_t kb = 0; causal_everywhere && kb < kv_blocks; ++kb) {
      causal_everywhere = visible[qb][kb] == (kb <= qb) && (kb >= qb || full[qb][kb]);
    }
    causal_everywhere = causal_everywhere && causal_diagonal(qb);
  }
  if (causal_everywhere) {
    groups.push_back(whole_causal_call(b0, g.batch, g));
    return;
  }

  // Where ranges differ from one query block to the next (documents), a
  // range ending in an exactly causal diagonal block is cut there: the
  // diagonal blocks of all query blocks make one batched causal call and the
  // rest of each range runs unmasked, merged by log-sum-exp. Where every
  // block shares one masked range (windows) that single batched call is
  // cheaper than two calls and a merge, so ranges are kept whole.
  const bool cut_diagonals = !translation_invariant(spec);
  std::vector<Piece> pieces;
  std::vector<Run> previous;
  bool previous_merges = false;
  for (std::int64_t qb = 0; qb < q_blocks; ++qb) {
    std::vector<Run> runs;
    for (std::int64_t kb = 0; kb < kv_blocks; ++kb) {
      if (!visible[qb][kb]) continue;
      if (!runs.empty() && runs.back().kb1 == kb) {
        runs.back().kb1 = kb + 1;
        runs.back().partial = runs.back().partial || !full[qb][kb];
      } else {
        runs.push_back({kb, kb + 1, !full[qb][kb]});
      }
    }
    const std::int64_t q0 = qb * bq;
    const std::int64_t rows = std::min(bq, g.q_len - q0);
    const bool cut =
        cut_diagonals && !runs.empty() && runs.back().kb1 == qb + 1 && causal_diagonal(qb);
    if (cut) {
      Run& last_run = runs.back();
      last_run.kb1 = qb;
      last_run.partial = false;
      for (std::int64_t kb = last_run.kb0; kb < last_run.kb1; ++kb) {
        last_run.partial = last_run.partial || !full[qb][kb];
      }
      if (last_run.kb0 == last_run.kb1) runs.pop_back();
    }
    bool any_partial = false;
    for (const Run& r : runs) any_partial = any_partial || r.partial;
    // Query blocks that see the same unmasked ranges share their calls.
    if (!cut && previous_merges && !any_partial && runs == previous) {
      for (std::size_t i = 0; i < runs.size(); ++i) pieces[pieces.size() - 1 - i].rows += rows;
      continue;
    }
    // The diagonals go last (kDiagonalRun) in every query block, so that
    // all of them are evenly spaced and batch into one call, which merges
    // once into what the other ranges wrote (or into nothing, for the first
    // block of a document: weight 0 on the empty part).
    if (cut) {
      Piece p;
      p.q0 = q0;
      p.rows = rows;
      p.k0 = q0;
      p.len = rows;
      p.run = kDiagonalRun;
      p.causal = true;
      pieces.push_back(std::move(p));
    }
    for (std::size_t i = 0; i < runs.size(); ++i) {
      Piece p;
      p.q0 = q0;
      p.rows = rows;
      p.k0 = runs[i].kb0 * bk;
      p.len = std::min(g.kv_len, runs[i].kb1 * bk) - p.k0;
      p.run = static_cast<std::int64_t>(i);
      p.mask_id = runs[i].partial ? 0 : -1;  // resolved below
      pieces.push_back(std::move(p));
    }
    previous = std::move(runs);
    previous_merges = !cut && !any_partial;
  }

  // Masks of partial pieces. Under a translation-invariant spec a mask is
  // fixed by (q0 - k0, rows, len), so equal keys share one tensor; otherwise
  // pieces are compared by content when they could be batched.
  const bool invariant = translation_invariant(spec);
  struct DistinctMask {
    std::int64_t offset, rows, len;
    TileMask mask;
  };
  std::vector<DistinctMask> masks;
  for (Piece& p : pieces) {
    if (p.mask_id < 0) continue;
    if (invariant) {
      const std::int64_t offset = p.q0 - p.k0;
      std::int64_t id = -1;
      for (std::size_t s = 0; s < masks.size(); ++s) {
        if (masks[s].offset == offset && masks[s].rows == p.rows && masks[s].len == p.len) {
          id = static_cast<std::int64_t>(s);
        }
      }
      if (id < 0) {
        masks.push_back({offset, p.rows, p.len, tile_mask(spec, g, p, dtype)});
        id = static_cast<std::int64_t>(masks.size()) - 1;
      }
      p.mask_id = id;
      p.mask = masks[static_cast<std::size_t>(id)].mask.additive;
      p.nonempty = masks[static_cast<std::size_t>(id)].mask.nonempty;
    } else {
      const TileMask t = tile_mask(spec, g, p, dtype);
      p.mask = t.additive;
      p.nonempty = t.nonempty;
    }
  }

  // Batch evenly spaced pieces of one run index, shape and mask into groups.
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.run < b.run; });
  const auto same_mask = [invariant](const Piece& a, const Piece& b) {
    if (a.mask.defined() != b.mask.defined()) return false;
    if (!a.mask.defined()) return true;
    if (invariant) return a.mask_id == b.mask_id;
    return a.mask.sizes() == b.mask.sizes() && at::equal(a.mask, b.mask);
  };
  const Piece* last = nullptr;
  for (const Piece& p : pieces) {
    FlashGroup* open = groups.empty() ? nullptr : &groups.back();
    if (last != nullptr && open != nullptr && last->run == p.run && last->rows == p.rows &&
        last->len == p.len && p.k0 >= last->k0 && last->causal == p.causal && same_mask(*last, p)) {
      const std::int64_t q_step = p.q0 - last->q0;
      const std::int64_t k_step = p.k0 - last->k0;
      if (open->count == 1 || (open->q_step == q_step && open->k_step == k_step)) {
        open->q_step = q_step;
        open->k_step = k_step;
        ++open->count;
        last = &p;
        continue;
      }
    }
    FlashGroup group;
    group.b0 = b0;
    group.nb = g.batch;
    group.q0 = p.q0;
    group.q_step = p.rows;
    group.rows = p.rows;
    group.k0 = p.k0;
    group.k_step = p.len;
    group.len = p.len;
    group.causal = p.causal;
    group.mask = p.mask;
    group.nonempty = p.nonempty;
    // Every run after the first present merges into what came before
    // (rows no earlier run wrote hold out 0 and lse -inf: weight 0).
    group.merge = p.run > pieces.front().run;
    groups.push_back(std::move(group));
    last = &p;
  }
}

}  // namespace

// The block sizes: those of the first block-mask term, else 128.
std::pair<std::int64_t, std::int64_t> block_sizes(const AttentionSpec& spec) {
  for (const Mask& m : spec.masks) {
    if (m.kind == MaskKind::block) return {m.block.q_block_size, m.block.kv_block_size};
  }
  return {kDefaultBlock, kDefaultBlock};
}

std::vector<FlashGroup> plan_flash_groups(const AttentionSpec& spec, const MaskGeometry& whole,
                                          at::ScalarType dtype) {
  std::vector<FlashGroup> groups;
  if (spec.masks.size() == 1 && spec.masks[0].kind == MaskKind::causal &&
      query_offset(spec.masks[0].alignment, whole) == 0) {
    // Plain top-left causal: one call with the kernel's own causal mask.
    groups.push_back(whole_causal_call(0, whole.batch, whole));
    return groups;
  }
  if (positional(spec) || whole.batch == 1) {
    plan_batches(spec, whole, 0, dtype, groups);
  } else {
    for (std::int64_t b = 0; b < whole.batch; ++b) {
      const MaskGeometry one{1, whole.q_heads, whole.q_len, whole.kv_len};
      plan_batches(batch_slice(spec, b), one, b, dtype, groups);
    }
  }
  return groups;
}

}  // namespace keel::kernels
