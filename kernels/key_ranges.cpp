#include "key_ranges.h"

#include <algorithm>
#include <cstddef>

#include <ATen/ATen.h>

namespace keel::kernels {

std::optional<std::pair<std::int64_t, std::int64_t>> DocumentRuns::keys_of(std::int64_t d) const {
  std::pair<std::int64_t, std::int64_t> span{0, 0};
  bool seen = false;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != d) continue;
    if (seen) return std::nullopt;
    seen = true;
    span = {starts[i], starts[i + 1]};
  }
  return span;
}

std::vector<DocumentRuns> document_runs(const AttentionSpec& spec, std::int64_t sequences) {
  std::vector<DocumentRuns> runs;
  if (sequences != 1 || (spec.combine != MaskCombine::all_of && spec.masks.size() > 1)) {
    return runs;
  }
  for (const Mask& m : spec.masks) {
    if (m.kind != MaskKind::document) continue;
    DocumentRuns d;
    const at::Tensor q = m.q_document_ids.to(at::kLong).contiguous();
    const at::Tensor kv = m.kv_document_ids.to(at::kLong).contiguous();
    const std::int64_t* qp = q.data_ptr<std::int64_t>();
    d.q_ids.assign(qp, qp + q.numel());
    const std::int64_t* kp = kv.data_ptr<std::int64_t>();
    const std::int64_t n = kv.numel();
    for (std::int64_t j = 0; j < n; ++j) {
      if (j == 0 || kp[j] != kp[j - 1]) {
        d.ids.push_back(kp[j]);
        d.starts.push_back(j);
      }
    }
    d.starts.push_back(n);
    runs.push_back(std::move(d));
  }
  return runs;
}

std::optional<KeyRange> interval_range(const AttentionSpec& spec, const MaskGeometry& g,
                                       std::int64_t q0, std::int64_t rows,
                                       const std::vector<DocumentRuns>& docs) {
  if (spec.combine != MaskCombine::all_of && spec.masks.size() > 1) return std::nullopt;
  KeyRange r{0, g.kv_len, true, 0, g.kv_len};
  std::size_t doc = 0;
  for (const Mask& m : spec.masks) {
    const std::int64_t p0 = query_offset(m.alignment, g) + q0;  // first query's position
    const std::int64_t p1 = p0 + rows - 1;                      // last query's position
    switch (m.kind) {
      case MaskKind::causal:
        r.hi = std::min(r.hi, p1 + 1);
        r.inner_hi = std::min(r.inner_hi, p0 + 1);
        r.full = r.full && rows == 1;
        break;
      case MaskKind::sliding_window:
        // The core saturates the window to Lq + Lk: no overflow here.
        r.lo = std::max(r.lo, p0 - m.window_left);
        r.hi = std::min(r.hi, p1 + m.window_right + 1);
        r.inner_lo = std::max(r.inner_lo, p1 - m.window_left);
        r.inner_hi = std::min(r.inner_hi, p0 + m.window_right + 1);
        r.full = r.full && rows == 1;
        break;
      case MaskKind::key_padding: {
        const auto len = m.kv_lengths.item<std::int64_t>();
        r.hi = std::min(r.hi, len);
        r.inner_hi = std::min(r.inner_hi, len);
        break;
      }
      case MaskKind::document: {
        if (doc >= docs.size()) return std::nullopt;
        const DocumentRuns& d = docs[doc++];
        // The hull of the rows' documents, and the keys all of them share.
        std::int64_t hull_lo = g.kv_len, hull_hi = 0, common_lo = 0, common_hi = g.kv_len;
        std::optional<std::pair<std::int64_t, std::int64_t>> keys;
        for (std::int64_t i = q0; i < q0 + rows; ++i) {
          const std::int64_t id = d.q_ids[static_cast<std::size_t>(i)];
          if (i == q0 || id != d.q_ids[static_cast<std::size_t>(i - 1)]) keys = d.keys_of(id);
          if (!keys) return std::nullopt;
          common_lo = std::max(common_lo, keys->first);
          common_hi = std::min(common_hi, keys->second);
          if (keys->first == keys->second) continue;
          hull_lo = std::min(hull_lo, keys->first);
          hull_hi = std::max(hull_hi, keys->second);
        }
        if (hull_hi <= hull_lo) return KeyRange{};
        r.full = r.full && common_lo == hull_lo && common_hi == hull_hi;
        r.lo = std::max(r.lo, hull_lo);
        r.hi = std::min(r.hi, hull_hi);
        r.inner_lo = std::max(r.inner_lo, common_lo);
        r.inner_hi = std::min(r.inner_hi, common_hi);
        break;
      }
      default:
        return std::nullopt;
    }
  }
  if (r.hi <= r.lo) return KeyRange{};
  r.inner_lo = std::max(r.inner_lo, r.lo);
  r.inner_hi = std::min(r.inner_hi, r.hi);
  if (r.inner_hi < r.inner_lo) r.inner_hi = r.inner_lo;
  return r;
}

KeyRange classified_range(const BlockClasses& c, std::int64_t qb, std::int64_t kv_len,
                          std::int64_t key_block) {
  const auto visible = c.visible.accessor<bool, 2>();
  const auto full = c.full.accessor<bool, 2>();
  const std::int64_t blocks = c.visible.size(1);
  std::int64_t first = -1;
  std::int64_t last = -1;
  for (std::int64_t kb = 0; kb < blocks; ++kb) {
    if (!visible[qb][kb]) continue;
    if (first < 0) first = kb;
    last = kb;
  }
  if (first < 0) return {};
  bool all_full = true;
  // The longest run of key blocks every query sees whole.
  std::int64_t run0 = 0, run1 = 0;
  for (std::int64_t kb = first, start = first; kb <= last; ++kb) {
    all_full = all_full && full[qb][kb];
    if (!full[qb][kb]) {
      start = kb + 1;
    } else if (kb + 1 - start > run1 - run0) {
      run0 = start;
      run1 = kb + 1;
    }
  }
  return {first * key_block, std::min(kv_len, (last + 1) * key_block), all_full, run0 * key_block,
          std::min(kv_len, run1 * key_block)};
}

bool row_intervals(const AttentionSpec& spec, const MaskGeometry& g, std::int64_t q0,
                   std::int64_t rows, const std::vector<DocumentRuns>& docs, const KeyRange& range,
                   std::vector<std::int64_t>& lo, std::vector<std::int64_t>& hi) {
  lo.assign(static_cast<std::size_t>(rows), range.lo);
  hi.assign(static_cast<std::size_t>(rows), range.hi);
  if (range.full) return true;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::optional<KeyRange> own = interval_range(spec, g, q0 + r, 1, docs);
    if (!own || !own->full) return false;
    lo[static_cast<std::size_t>(r)] = own->lo;
    hi[static_cast<std::size_t>(r)] = own->hi;
  }
  return true;
}

bool same_for_every_sequence(const AttentionSpec& spec, std::int64_t batch) {
  if (batch == 1) return true;
  const auto per_sequence = [&](const at::Tensor& t, std::int64_t rank) {
    return t.defined() && t.dim() == rank && t.size(0) == batch;
  };
  if (per_sequence(spec.bias, 4)) return false;
  for (const Mask& m : spec.masks) {
    switch (m.kind) {
      case MaskKind::causal:
      case MaskKind::sliding_window:
      case MaskKind::chunked_causal:
        break;
      case MaskKind::tensor:
        if (per_sequence(m.tensor, 4)) return false;
        break;
      case MaskKind::block:
        if (per_sequence(m.block.kv_num_blocks, 3)) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace keel::kernels
