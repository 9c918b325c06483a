#include "sequence_spec.h"

#include <ATen/core/Tensor.h>

namespace keel::kernels {

namespace {

// `t` narrowed to batch b when its leading dim is the batch (of size B > 1);
// a tensor that broadcasts over the batch is kept whole.
void narrow_batch(at::Tensor& t, std::int64_t b, std::int64_t batch, std::int64_t batch_dim_rank) {
  if (batch > 1 && t.defined() && t.dim() == batch_dim_rank && t.size(0) == batch) {
    t = t.narrow(0, b, 1);
  }
}

}  // namespace

AttentionSpec batch_slice(const AttentionSpec& spec, std::int64_t b, std::int64_t batch) {
  AttentionSpec s = spec;
  for (Mask& m : s.masks) {
    narrow_batch(m.prefix_lengths, b, batch, 1);
    narrow_batch(m.kv_lengths, b, batch, 1);
    narrow_batch(m.q_document_ids, b, batch, 2);
    narrow_batch(m.kv_document_ids, b, batch, 2);
    narrow_batch(m.tensor, b, batch, 4);
    narrow_batch(m.block.kv_num_blocks, b, batch, 3);
    narrow_batch(m.block.kv_indices, b, batch, 4);
    narrow_batch(m.block.full_kv_num_blocks, b, batch, 3);
    narrow_batch(m.block.full_kv_indices, b, batch, 4);
  }
  narrow_batch(s.bias, b, batch, 4);
  return s;
}

AttentionSpec paged_sequence_spec(const AttentionSpec& spec, std::int64_t b, std::int64_t batch,
                                  std::int64_t len, std::int64_t logical_len) {
  AttentionSpec s = batch_slice(spec, b, batch);
  const auto narrow_keys = [&](at::Tensor& t) {
    if (t.defined() && t.dim() > 0 && t.size(-1) == logical_len && logical_len != 1) {
      t = t.narrow(-1, 0, len);
    }
  };
  for (Mask& m : s.masks) {
    narrow_keys(m.kv_document_ids);
    narrow_keys(m.tensor);
  }
  narrow_keys(s.bias);
  return s;
}

}  // namespace keel::kernels
