// Which keys of a cache a block of queries may see, from the mask spec
// alone: the range the decode kernel reads, and whether it needs a mask.
// Exact arithmetic for the terms whose visible keys are one interval per
// query (causal, sliding window, key padding, a document whose keys are one
// run), key blocks classified by attention_mask.h for the rest.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "attention_mask.h"
#include "keel/v1/attention.h"

namespace keel::kernels {

// The keys [lo, hi) that some query of the block may see, and whether every
// query sees all of them; [inner_lo, inner_hi) within it, keys that every
// query sees (empty when unknown).
struct KeyRange {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  bool full = false;
  std::int64_t inner_lo = 0;
  std::int64_t inner_hi = 0;
};

// One document term of one sequence, read once per call: its queries' ids,
// and the runs of equal ids among its keys (run i is keys [starts[i],
// starts[i + 1]), of id ids[i]), so that a query's document is looked up
// among the runs, not found by a scan of the keys.
struct DocumentRuns {
  std::vector<std::int64_t> q_ids;
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> starts;  // one more than ids: the last is Lk

  // The keys of document d as [lo, hi) (lo == hi when no key has it); no
  // value when they are not one interval (d has two runs or more).
  std::optional<std::pair<std::int64_t, std::int64_t>> keys_of(std::int64_t d) const;
};

// The document terms of `spec`, in the order of its masks, for a spec of one
// sequence (ids of batch 1). None when the spec holds more sequences, or
// combines its terms with any_of (their document terms then take the block
// classifier).
std::vector<DocumentRuns> document_runs(const AttentionSpec& spec, std::int64_t sequences);

// The range from the mask spec's own arithmetic over queries [q0, q0 +
// rows), for terms whose visible keys are an interval per query combined
// with all_of: exact, so that a single query (Lq = 1) never needs a mask.
// No value when another term or any_of needs the block classifier.
std::optional<KeyRange> interval_range(const AttentionSpec& spec, const MaskGeometry& g,
                                       std::int64_t q0, std::int64_t rows,
                                       const std::vector<DocumentRuns>& docs);

// The hull of the key blocks (of `key_block` keys) visible from query block
// `qb` of `c`, and the longest run of them every query sees whole.
KeyRange classified_range(const BlockClasses& c, std::int64_t qb, std::int64_t kv_len,
                          std::int64_t key_block);

// Each query's visible keys as one interval, [lo[r], hi[r]) for query q0 +
// r: the block's range when every query sees all of it, else each query's
// own interval from the mask's arithmetic. False when a query's keys are
// not one interval (a document in pieces, a boolean mask, any_of).
bool row_intervals(const AttentionSpec& spec, const MaskGeometry& g, std::int64_t q0,
                   std::int64_t rows, const std::vector<DocumentRuns>& docs, const KeyRange& range,
                   std::vector<std::int64_t>& lo, std::vector<std::int64_t>& hi);

// Whether the visible keys are the same for every sequence of the batch:
// no term or bias reads a per-sequence tensor.
bool same_for_every_sequence(const AttentionSpec& spec, std::int64_t batch);

}  // namespace keel::kernels
