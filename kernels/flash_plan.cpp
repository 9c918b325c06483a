#include "flash_plan.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "sequence_spec.h"

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

// The classes of a spec's blocks, as the planner reads them: per query
// block, its runs of visible key blocks, and whether its diagonal block is
// exactly the kernel's causal triangle.
class BlockGrid {
 public:
  BlockGrid(const AttentionSpec& spec, const MaskGeometry& g)
      : spec_(spec),
        g_(g),
        bq_(block_sizes(spec).first),
        bk_(block_sizes(spec).second),
        classes_(classify_blocks(spec, g, at::kCPU, bq_, bk_)),
        visible_(classes_.visible.accessor<bool, 2>()),
        full_(classes_.full.accessor<bool, 2>()),
        q_blocks_(block_count(g.q_len, bq_)),
        kv_blocks_(block_count(g.kv_len, bk_)),
        diagonal_known_(static_cast<std::size_t>(q_blocks_), -1) {}

  std::int64_t bq() const { return bq_; }
  std::int64_t bk() const { return bk_; }
  std::int64_t q_blocks() const { return q_blocks_; }
  bool visible(std::int64_t qb, std::int64_t kb) const { return visible_[qb][kb]; }
  bool full(std::int64_t qb, std::int64_t kb) const { return full_[qb][kb]; }

  // Queries [q0, q0 + rows) of query block qb.
  std::int64_t q0(std::int64_t qb) const { return qb * bq_; }
  std::int64_t rows(std::int64_t qb) const { return std::min(bq_, g_.q_len - qb * bq_); }

  // A range [kb0, kb1) of visible key blocks of one query block; partial
  // when some block of it is not seen whole.
  struct Run {
    std::int64_t kb0, kb1;
    bool partial;
    bool operator==(const Run& o) const {
      return kb0 == o.kb0 && kb1 == o.kb1 && partial == o.partial;
    }
  };
  std::vector<Run> runs(std::int64_t qb) const {
    std::vector<Run> runs;
    for (std::int64_t kb = 0; kb < kv_blocks_; ++kb) {
      if (!visible(qb, kb)) continue;
      if (!runs.empty() && runs.back().kb1 == kb) {
        runs.back().kb1 = kb + 1;
        runs.back().partial = runs.back().partial || !full(qb, kb);
      } else {
        runs.push_back({kb, kb + 1, !full(qb, kb)});
      }
    }
    return runs;
  }

  // Whether the diagonal block of query block qb is visible exactly as its
  // lower triangle (key j sees query i iff j <= i within the block), so that
  // the kernel's own causal flag serves it without a mask. Each block's tile
  // is materialised at most once.
  bool causal_diagonal(std::int64_t qb) {
    std::int8_t& known = diagonal_known_[static_cast<std::size_t>(qb)];
    if (known >= 0) return known == 1;
    const std::int64_t q0 = this->q0(qb);
    const std::int64_t rows = this->rows(qb);
    bool causal = bq_ == bk_ && qb < kv_blocks_ && visible(qb, qb) && !full(qb, qb) &&
                  rows == std::min(bk_, g_.kv_len - q0);
    if (causal) {
      const at::Tensor keys = at::arange(q0, q0 + rows, at::TensorOptions().dtype(at::kLong));
      const at::Tensor keep = materialize_tile(spec_, g_, q0, rows, keys);
      causal = keep.size(0) == 1 && keep.size(1) == 1 &&
               at::equal(keep.view({rows, rows}), at::ones({rows, rows}, keep.options()).tril());
    }
    known = causal ? 1 : 0;
    return causal;
  }

  // Whether the mask is plain top-left causal in disguise (a window or
  // documents at least as long as the sequence).
  bool causal_everywhere() {
    if (g_.q_len != g_.kv_len || bq_ != bk_) return false;
    for (std::int64_t qb = 0; qb < q_blocks_; ++qb) {
      for (std::int64_t kb = 0; kb < kv_blocks_; ++kb) {
        if (visible(qb, kb) != (kb <= qb) || (kb < qb && !full(qb, kb))) return false;
      }
      if (!causal_diagonal(qb)) return false;
    }
    return true;
  }

 private:
  const AttentionSpec& spec_;
  const MaskGeometry& g_;
  std::int64_t bq_, bk_;
  BlockClasses classes_;
  at::TensorAccessor<bool, 2> visible_;
  at::TensorAccessor<bool, 2> full_;
  std::int64_t q_blocks_, kv_blocks_;
  std::vector<std::int8_t> diagonal_known_;
};

// Step 1: each query block's ranges of visible keys as pieces. Where ranges
// differ from one query block to the next (documents, `cut_diagonals`), a
// range ending in an exactly causal diagonal block is cut there: the
// diagonal blocks of all query blocks make one batched causal call and the
// rest of each range runs unmasked, merged by log-sum-exp. Where every block
// shares one masked range (windows) that single batched call is cheaper
// than two calls and a merge, so ranges are kept whole. Consecutive query
// blocks that see the same unmasked ranges share their pieces.
std::vector<Piece> cut_pieces(BlockGrid& grid, const MaskGeometry& g, bool cut_diagonals) {
  std::vector<Piece> pieces;
  std::vector<BlockGrid::Run> previous;
  bool previous_merges = false;
  for (std::int64_t qb = 0; qb < grid.q_blocks(); ++qb) {
    std::vector<BlockGrid::Run> runs = grid.runs(qb);
    const std::int64_t q0 = grid.q0(qb);
    const std::int64_t rows = grid.rows(qb);
    const bool cut =
        cut_diagonals && !runs.empty() && runs.back().kb1 == qb + 1 && grid.causal_diagonal(qb);
    if (cut) {
      BlockGrid::Run& last_run = runs.back();
      last_run.kb1 = qb;
      last_run.partial = false;
      for (std::int64_t kb = last_run.kb0; kb < last_run.kb1; ++kb) {
        last_run.partial = last_run.partial || !grid.full(qb, kb);
      }
      if (last_run.kb0 == last_run.kb1) runs.pop_back();
    }
    bool any_partial = false;
    for (const BlockGrid::Run& r : runs) any_partial = any_partial || r.partial;
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
      p.k0 = runs[i].kb0 * grid.bk();
      p.len = std::min(g.kv_len, runs[i].kb1 * grid.bk()) - p.k0;
      p.run = static_cast<std::int64_t>(i);
      p.mask_id = runs[i].partial ? 0 : -1;  // resolved by attach_masks
      pieces.push_back(std::move(p));
    }
    previous = std::move(runs);
    previous_merges = !cut && !any_partial;
  }
  return pieces;
}

// Step 2: the masks of partial pieces. Under a translation-invariant spec a
// mask is fixed by (q0 - k0, rows, len), so equal keys share one tensor (and
// one mask_id); otherwise each piece has its own, compared by content when
// pieces could be batched.
void attach_masks(const AttentionSpec& spec, const MaskGeometry& g, at::ScalarType dtype,
                  bool invariant, std::vector<Piece>& pieces) {
  struct DistinctMask {
    std::int64_t offset, rows, len;
    TileMask mask;
  };
  std::vector<DistinctMask> masks;
  for (Piece& p : pieces) {
    if (p.mask_id < 0) continue;
    if (!invariant) {
      const TileMask t = tile_mask(spec, g, p, dtype);
      p.mask = t.additive;
      p.nonempty = t.nonempty;
      continue;
    }
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
  }
}

// Step 3: evenly spaced pieces of one run index, shape and mask batched into
// one call each, in run order: every run after the first present merges into
// what came before (rows no earlier run wrote hold out 0 and lse -inf:
// weight 0).
void batch_pieces(std::vector<Piece>& pieces, std::int64_t b0, const MaskGeometry& g,
                  bool invariant, std::vector<FlashGroup>& groups) {
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.run < b.run; });
  const auto same_mask = [invariant](const Piece& a, const Piece& b) {
    if (a.mask.defined() != b.mask.defined()) return false;
    if (!a.mask.defined()) return true;
    if (invariant) return a.mask_id == b.mask_id;
    return a.mask.sizes() == b.mask.sizes() && at::equal(a.mask, b.mask);
  };
  const std::size_t first = groups.size();
  const Piece* last = nullptr;
  for (const Piece& p : pieces) {
    FlashGroup* open = groups.size() == first ? nullptr : &groups.back();
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
    group.merge = p.run > pieces.front().run;
    groups.push_back(std::move(group));
    last = &p;
  }
}

// The calls of the flash route for batches [b0, b0 + g.batch) under `spec`:
// one causal call where the mask is causal in disguise, else the pieces of
// each query block, their masks, and their batches.
void plan_batches(const AttentionSpec& spec, const MaskGeometry& g, std::int64_t b0,
                  at::ScalarType dtype, std::vector<FlashGroup>& groups) {
  BlockGrid grid(spec, g);
  if (grid.causal_everywhere()) {
    groups.push_back(whole_causal_call(b0, g.batch, g));
    return;
  }
  const bool invariant = translation_invariant(spec);
  std::vector<Piece> pieces = cut_pieces(grid, g, /*cut_diagonals=*/!invariant);
  attach_masks(spec, g, dtype, invariant, pieces);
  batch_pieces(pieces, b0, g, invariant, groups);
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
      plan_batches(batch_slice(spec, b, whole.batch), one, b, dtype, groups);
    }
  }
  return groups;
}

}  // namespace keel::kernels
