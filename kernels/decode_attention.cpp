#include "decode_attention.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "accumulation.h"
#include "attention_mask.h"
#include "attention_route.h"
#include "decode_policy.h"
#include "fused_decode.h"
#include "key_ranges.h"
#include "kv_cache_read.h"
#include "row_softmax.h"
#include "score_modifiers.h"
#include "sequence_spec.h"

namespace keel::kernels {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// One block of queries as the plan hands it to the run: its rows, its
// visible keys, its route, and for the fused kernel each query's interval.
struct BlockPlan {
  std::int64_t q0 = 0;
  std::int64_t rows = 0;
  BlockRoute route = BlockRoute::nothing_visible;
  KeyRange range;
  std::vector<std::int64_t> lo, hi;
};

// The plan of sequences [b0, b0 + nb) that see the same keys (FlashInfer's
// plan/run): every decision that reads the mask spec, made before any block
// runs. The run reads the spec only through `tile` and `modify`, which the
// plan binds to these sequences.
struct SequencePlan {
  MaskGeometry g;
  DecodeRoutes routes;
  std::vector<BlockPlan> blocks;
  // The mask over queries [q0, q0 + rows) and the int64 positions `keys`:
  // bool [nb|1, Hq|1, rows, keys].
  std::function<at::Tensor(std::int64_t q0, std::int64_t rows, const at::Tensor& keys)> tile;
  // The scores of those queries and keys with the score modifiers applied
  // (soft-cap, ALiBi, bias); `modifies` says whether there are any.
  std::function<at::Tensor(at::Tensor s, std::int64_t q0, std::int64_t rows,
                           const at::Tensor& keys)>
      modify;
  bool modifies = false;
};

// Plans sequences [b0, b0 + nb) of q (q_len queries, group query heads per
// kv head) against kv_len keys of `k` and `v` under `sb`: the routes open
// to them, then each block's visible keys and route.
SequencePlan plan_sequences(const at::Tensor& q, const CacheSide& k, const CacheSide& v,
                            std::int64_t nb, std::int64_t kv_len, std::int64_t group,
                            const AttentionSpec& sb) {
  SequencePlan plan;
  const std::int64_t q_len = q.size(2);
  plan.g = MaskGeometry{nb, q.size(1), q_len, kv_len};
  const MaskGeometry& g = plan.g;
  plan.routes = decode_routes(q, k.t, v.t, sb, group, k.pages != nullptr);
  const std::int64_t block_rows = plan.routes.block_rows;
  BlockClasses classes;
  const std::vector<DocumentRuns> docs = document_runs(sb, nb);
  for (std::int64_t q0 = 0; q0 < q_len; q0 += block_rows) {
    BlockPlan b;
    b.q0 = q0;
    b.rows = std::min(block_rows, q_len - q0);
    std::optional<KeyRange> range = interval_range(sb, g, q0, b.rows, docs);
    if (!range) {
      if (!classes.visible.defined()) {
        classes = classify_blocks(sb, g, at::kCPU, block_rows, kKeyBlock);
      }
      range = classified_range(classes, q0 / block_rows, kv_len, kKeyBlock);
    }
    b.range = *range;
    b.route = block_route(plan.routes, nb, b.range, [&] {
      return row_intervals(sb, g, q0, b.rows, docs, b.range, b.lo, b.hi);
    });
    plan.blocks.push_back(std::move(b));
  }
  plan.tile = [sb, g](std::int64_t q0, std::int64_t rows, const at::Tensor& keys) {
    return materialize_tile(sb, g, q0, rows, keys);
  };
  plan.modifies = sb.softcap > 0 || sb.alibi_slopes.defined() || sb.bias.defined();
  plan.modify = [sb, g](at::Tensor s, std::int64_t q0, std::int64_t rows, const at::Tensor& keys) {
    if (sb.softcap > 0) s = (s / sb.softcap).tanh() * sb.softcap;
    if (sb.alibi_slopes.defined() || sb.bias.defined()) {
      s = add_score_modifiers(s, sb, q0, rows, keys, g.q_len, g.kv_len);
    }
    return s;
  };
  return plan;
}

// One call's queries and the state its sequences share.
class Attend {
 public:
  // `nothing` gives the output of a block that sees no key (0, on the graph
  // where autograd must reach the inputs); called only for such a block.
  Attend(const at::Tensor& q, std::int64_t kv_heads, std::int64_t value_dim, double scale,
         std::function<at::Tensor()> nothing)
      : q_(q),
        nothing_(std::move(nothing)),
        acc_(accumulation_dtype(q.scalar_type())),
        q_heads_(q.size(1)),
        q_len_(q.size(2)),
        kv_heads_(kv_heads),
        value_dim_(value_dim),
        group_(q.size(1) / kv_heads),
        scale_(scale) {}

  // Sequences [b0, b0 + nb) of q, which see the same keys under `sb`,
  // against sequences [c0, c0 + nb) of the cache (kv_len keys each): planned
  // first (plan_sequences), then each block run on the route its plan gives.
  void sequences(std::int64_t b0, std::int64_t nb, const CacheSide& k, const CacheSide& v,
                 std::int64_t c0, std::int64_t kv_len, const AttentionSpec& sb) {
    const SequencePlan plan = plan_sequences(q_, k, v, nb, kv_len, group_, sb);
    blocks_ = std::max(blocks_, static_cast<std::int64_t>(plan.blocks.size()));
    std::vector<at::Tensor> outs;
    std::vector<at::Tensor> lses;
    for (const BlockPlan& b : plan.blocks) {
      switch (b.route) {
        case BlockRoute::nothing_visible:
          nothing_visible(nb, b.rows, outs, lses);
          break;
        case BlockRoute::fused:
          fused_block(b0, nb, b.q0, b.rows, k, v, c0, b.lo, b.hi, outs, lses);
          break;
        case BlockRoute::flash:
          flash_block(b0, nb, b, k.t, v.t, c0, plan, outs, lses);
          break;
        case BlockRoute::products:
          block(b0, nb, b, k, v, c0, plan, outs, lses);
          break;
      }
    }
    outs_.push_back(outs.size() == 1 ? outs[0] : at::cat(outs, 2));
    lses_.push_back(lses.size() == 1 ? lses[0] : at::cat(lses, 2));
  }

  // `keys` is the number of keys the cache holds, over every sequence.
  AttentionOutput result(std::int64_t keys) && {
    AttentionOutput r;
    r.out = (outs_.size() == 1 ? outs_[0] : at::cat(outs_, 0)).to(q_.scalar_type());
    r.lse = lses_.size() == 1 ? lses_[0] : at::cat(lses_, 0);
    // Each block of queries reads the cache again.
    r.visible_fraction = keys > 0 ? read_ / static_cast<double>(keys * blocks_) : 0.0;
    return r;
  }

 private:
  // The block on keel's fused kernel (fused_decode.h): each kv head's rows
  // against the visible keys, read where they lie, in the cache's dtype.
  void fused_block(std::int64_t b0, std::int64_t nb, std::int64_t q0, std::int64_t rows,
                   const CacheSide& k, const CacheSide& v, std::int64_t c0,
                   const std::vector<std::int64_t>& lo, const std::vector<std::int64_t>& hi,
                   std::vector<at::Tensor>& outs, std::vector<at::Tensor>& lses) {
    const std::int64_t first = *std::min_element(lo.begin(), lo.end());
    const std::int64_t last = *std::max_element(hi.begin(), hi.end());
    read_ += static_cast<double>(nb * std::max<std::int64_t>(0, last - first));
    const at::TensorOptions options = q_.options().dtype(at::kFloat);
    at::Tensor out = at::empty({nb, q_heads_, rows, value_dim_}, options);
    at::Tensor lse = at::empty({nb, q_heads_, rows}, options);
    const auto rows_of = [](const CacheSide& side) {
      const at::Tensor& t = side.t;
      return CacheRows{t.data_ptr(), t.stride(0), t.stride(1),
                       t.stride(2),  side.pages,  side.page_size};
    };
    FusedDecodeCall c;
    c.dtype = q_.scalar_type();
    c.q = q_.data_ptr();
    for (int d = 0; d < 4; ++d) c.q_strides[d] = q_.stride(d);
    c.k = rows_of(k);
    c.v = rows_of(v);
    c.b0 = b0;
    c.nb = nb;
    c.c0 = c0;
    c.q0 = q0;
    c.rows = rows;
    c.kv_heads = kv_heads_;
    c.group = group_;
    c.head_dim = q_.size(3);
    c.value_dim = value_dim_;
    c.scale = static_cast<float>(scale_);
    c.lo = lo.data();
    c.hi = hi.data();
    c.out = out.data_ptr<float>();
    c.lse = lse.data_ptr<float>();
    fused_decode(c);
    outs.push_back(std::move(out));
    lses.push_back(std::move(lse));
  }

  void block(std::int64_t b0, std::int64_t nb, const BlockPlan& b, const CacheSide& k,
             const CacheSide& v, std::int64_t c0, const SequencePlan& plan,
             std::vector<at::Tensor>& outs, std::vector<at::Tensor>& lses) {
    const std::int64_t q0 = b.q0;
    const std::int64_t rows = b.rows;
    const KeyRange& range = b.range;
    const std::int64_t len = range.hi - range.lo;
    read_ += static_cast<double>(nb * len);
    // For keel's products the scale is folded into q (once per call, and
    // only where they run); query head h reads kv head h / group, so the
    // group's queries are the rows of one product with that head.
    if (!qs_.defined()) qs_ = q_.to(acc_) * scale_;
    const at::Tensor qg = group_rows(qs_, b0, nb, q0, rows);
    at::Tensor s = cache_matmul(qg, k, c0, nb, range.lo, len, /*keys_are_columns=*/true, acc_)
                       .view({nb, q_heads_, rows, len});
    if (plan.modifies || !range.full) {
      const at::Tensor keys = at::arange(range.lo, range.hi, q_.options().dtype(at::kLong));
      if (plan.modifies) s = plan.modify(s, q0, rows, keys);
      if (!range.full) s = s.masked_fill(plan.tile(q0, rows, keys).logical_not(), kMinusInf);
    }
    const RowSoftmax p = row_softmax(s);
    const at::Tensor w = p.weights_unnormalised.reshape({nb, kv_heads_, group_ * rows, len});
    const at::Tensor o = cache_matmul(w, v, c0, nb, range.lo, len, /*keys_are_columns=*/false, acc_)
                             .view({nb, q_heads_, rows, value_dim_});
    outs.push_back(o / p.denominator);
    lses.push_back(p.lse.squeeze(-1));
  }

  // A block whose queries see no key: output 0 and lse -inf, still on the
  // graph.
  void nothing_visible(std::int64_t nb, std::int64_t rows, std::vector<at::Tensor>& outs,
                       std::vector<at::Tensor>& lses) {
    const at::TensorOptions options = q_.options().dtype(acc_);
    if (!anchor_.defined()) anchor_ = nothing_().to(acc_);
    outs.push_back(at::zeros({nb, q_heads_, rows, value_dim_}, options) + anchor_);
    lses.push_back(at::full({nb, q_heads_, rows}, kMinusInf, options));
  }

  // The block on libtorch's CPU flash kernel (flash_piece says in which
  // layout), against views of the visible keys in the cache's own dtype.
  // Keys every query sees run without a mask; only
  // the keys some query does not see carry one (additive, the layout of the
  // rows), in calls of their own merged by log-sum-exp, so that a chunk of
  // prefill masks its diagonal, not the whole cache. The merge needs the
  // pieces' lse on the graph, which libtorch's derivative drops: with
  // autograd on, the range stays one masked call.
  void flash_block(std::int64_t b0, std::int64_t nb, const BlockPlan& b, const at::Tensor& k,
                   const at::Tensor& v, std::int64_t c0, const SequencePlan& plan,
                   std::vector<at::Tensor>& outs, std::vector<at::Tensor>& lses) {
    const std::int64_t q0 = b.q0;
    const std::int64_t rows = b.rows;
    const KeyRange& range = b.range;
    read_ += static_cast<double>(nb * (range.hi - range.lo));
    const bool grad = at::GradMode::is_enabled() &&
                      (q_.requires_grad() || k.requires_grad() || v.requires_grad());
    if (!flash_splits(q_len_, range, grad)) {
      auto [o, l] = flash_piece(b0, nb, q0, rows, k, v, c0, range.lo, range.hi, !range.full, plan);
      outs.push_back(std::move(o));
      lses.push_back(std::move(l));
      return;
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> pieces;
    if (range.lo < range.inner_lo) {
      pieces.push_back(
          flash_piece(b0, nb, q0, rows, k, v, c0, range.lo, range.inner_lo, true, plan));
    }
    pieces.push_back(
        flash_piece(b0, nb, q0, rows, k, v, c0, range.inner_lo, range.inner_hi, false, plan));
    if (range.inner_hi < range.hi) {
      pieces.push_back(
          flash_piece(b0, nb, q0, rows, k, v, c0, range.inner_hi, range.hi, true, plan));
    }
    std::vector<at::Tensor> ls;
    ls.reserve(pieces.size());
    for (const auto& piece : pieces) ls.push_back(piece.second);
    // Every row sees the inner keys, so its lse is finite.
    const at::Tensor lse = at::logsumexp(at::stack(ls), 0);
    at::Tensor out;
    for (const auto& [o, l] : pieces) {
      const at::Tensor part = o * (l - lse).exp().unsqueeze(-1);
      out = out.defined() ? out + part : part;
    }
    outs.push_back(std::move(out));
    lses.push_back(lse);
  }

  // One call of the flash kernel over keys [lo, hi) of the block: its out
  // [nb, Hq, rows, Ev] and lse [nb, Hq, rows] in the accumulation dtype
  // (lse -inf for a row that sees none of them), with the tile of the mask
  // spec over those keys when `masked` (additive, in the layout of the
  // rows). In the group-rows layout q is [nb, Hkv, group * rows, E], row
  // gi * rows + r being query r of head kv * group + gi.
  std::pair<at::Tensor, at::Tensor> flash_piece(std::int64_t b0, std::int64_t nb, std::int64_t q0,
                                                std::int64_t rows, const at::Tensor& k,
                                                const at::Tensor& v, std::int64_t c0,
                                                std::int64_t lo, std::int64_t hi, bool masked,
                                                const SequencePlan& plan) const {
    const std::int64_t len = hi - lo;
    // The group's queries as the rows of their kv head (one product reads
    // each key once for the group), or the kernel's own grouped-query layout
    // (attention_route.h says which).
    const bool heads_layout = flash_heads_layout(q_, k, v, group_, rows, len);
    const at::Tensor qh =
        heads_layout ? q_.narrow(0, b0, nb).narrow(2, q0, rows) : group_rows(q_, b0, nb, q0, rows);
    const at::Tensor kb = k.narrow(0, c0, nb).narrow(2, lo, len);
    const at::Tensor vb = v.narrow(0, c0, nb).narrow(2, lo, len);
    std::optional<at::Tensor> mask;
    at::Tensor nonempty;
    if (masked) {
      const at::Tensor keys = at::arange(lo, hi, q_.options().dtype(at::kLong));
      at::Tensor keep = plan.tile(q0, rows, keys);  // [nb|1, Hq|1, rows, len]
      const std::int64_t mb = keep.size(0);
      if (!heads_layout) {
        keep = keep.size(1) == 1 ? keep.unsqueeze(1)
                                       .expand({mb, 1, group_, rows, len})
                                       .reshape({mb, 1, group_ * rows, len})
                                 : keep.reshape({mb, kv_heads_, group_ * rows, len});
      }
      mask = at::zeros(keep.sizes(), q_.options()).masked_fill_(keep.logical_not(), kMinusInf);
      nonempty = keep.any(-1);
      if (nonempty.all().item<bool>()) nonempty = at::Tensor();
    }
    auto [o, l] =
        at::_scaled_dot_product_flash_attention_for_cpu(qh, kb, vb, 0.0, false, mask, scale_);
    // A row that sees no key: the kernel's output is 0, its lse is not -inf.
    if (nonempty.defined()) l = l.masked_fill(nonempty.logical_not(), kMinusInf);
    return {o.reshape({nb, q_heads_, rows, value_dim_}).to(acc_),
            l.reshape({nb, q_heads_, rows}).to(acc_)};
  }

  // Queries [q0, q0 + rows) of sequences [b0, b0 + nb) of `t` ([B, Hq, Lq,
  // E]) as the rows of their kv heads: [nb, Hkv, group * rows, E].
  at::Tensor group_rows(const at::Tensor& t, std::int64_t b0, std::int64_t nb, std::int64_t q0,
                        std::int64_t rows) const {
    return t.narrow(0, b0, nb)
        .narrow(2, q0, rows)
        .reshape({nb, kv_heads_, group_ * rows, t.size(3)});
  }

  const at::Tensor& q_;
  std::function<at::Tensor()> nothing_;
  at::Tensor anchor_;
  at::ScalarType acc_;
  std::int64_t q_heads_, q_len_, kv_heads_, value_dim_, group_;
  double scale_;
  at::Tensor qs_;
  std::vector<at::Tensor> outs_;
  std::vector<at::Tensor> lses_;
  double read_ = 0;
  std::int64_t blocks_ = 1;
};

}  // namespace

AttentionOutput decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionSpec& spec, double scale) {
  const std::int64_t batch = q.size(0);
  const std::int64_t kv_len = k.size(2);
  Attend attend(q, k.size(1), v.size(3), scale, [&] { return zero_tied_to_inputs(q, k, v, spec); });
  const CacheSide ks{k};
  const CacheSide vs{v};
  if (same_for_every_sequence(spec, batch)) {
    attend.sequences(0, batch, ks, vs, 0, kv_len, spec);
  } else {
    for (std::int64_t b = 0; b < batch; ++b) {
      attend.sequences(b, 1, ks, vs, b, kv_len, batch_slice(spec, b, batch));
    }
  }
  return std::move(attend).result(batch * kv_len);
}

AttentionOutput paged_attention(const at::Tensor& q, const PagedKVCache& cache,
                                const AttentionSpec& spec, double scale) {
  const std::int64_t batch = q.size(0);
  const std::int64_t page_size = cache.k_pages.size(2);
  const at::Tensor table = cache.page_table.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor lengths = cache.lengths.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t logical_len = table.size(1) * page_size;
  // Off the autograd graph: a sequence that sees no key is plain 0.
  Attend attend(q, cache.k_pages.size(1), cache.v_pages.size(3), scale,
                [&] { return at::zeros({}, q.options()); });
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t* pages = table.data_ptr<std::int64_t>() + b * table.size(1);
    const CacheSide ks{cache.k_pages, pages, page_size};
    const CacheSide vs{cache.v_pages, pages, page_size};
    const std::int64_t len = lengths.data_ptr<std::int64_t>()[b];
    attend.sequences(b, 1, ks, vs, 0, len, paged_sequence_spec(spec, b, batch, len, logical_len));
  }
  return std::move(attend).result(lengths.sum().item<std::int64_t>());
}

}  // namespace keel::kernels
