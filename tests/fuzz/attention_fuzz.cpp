// Fuzz target: keel::attention with fuzzed shapes, dtypes, devices, layouts,
// mask terms, modifiers and dispatch choices. Every call must come back as a
// value or a keel::Error; a value must have the documented shape, and a
// backward through it must not crash.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_input.h"
#include "keel/v1/attention.h"

namespace {

using keel::fuzz::dim;
using keel::fuzz::dtype;
using keel::fuzz::parameter;
using keel::fuzz::real;
using keel::fuzz::tensor;

struct Dims {
  std::int64_t b, hq, hkv, lq, lk, e, ev;
};

keel::CausalAlignment alignment(FuzzedDataProvider& in) {
  return static_cast<keel::CausalAlignment>(in.ConsumeIntegralInRange<std::uint8_t>(0, 2));
}

at::ScalarType index_type(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? dtype(in) : at::kLong;
}

keel::Mask mask(FuzzedDataProvider& in, const Dims& d) {
  keel::Mask m;
  m.kind = static_cast<keel::MaskKind>(in.ConsumeIntegralInRange<std::uint8_t>(0, 8));
  m.alignment = alignment(in);
  switch (m.kind) {
    case keel::MaskKind::sliding_window:
      m.window_left = parameter(in);
      m.window_right = parameter(in);
      break;
    case keel::MaskKind::chunked_causal:
      m.chunk_size = parameter(in);
      break;
    case keel::MaskKind::prefix_lm:
      m.prefix_lengths = tensor(in, {d.b}, index_type(in), -2, d.lk + 2);
      break;
    case keel::MaskKind::document:
      m.q_document_ids = tensor(in, {d.b, d.lq}, index_type(in), 0, 3);
      m.kv_document_ids = tensor(in, {d.b, d.lk}, index_type(in), 0, 3);
      break;
    case keel::MaskKind::key_padding:
      m.kv_lengths = tensor(in, {d.b}, index_type(in), -1, d.lk + 1);
      break;
    case keel::MaskKind::block: {
      keel::BlockMask& bm = m.block;
      bm.q_block_size =
          in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(1, 4) : parameter(in);
      bm.kv_block_size =
          in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(1, 4) : parameter(in);
      // Block counts for the tensors' shapes (keel computes its own, and
      // must survive any block size, huge ones included).
      const auto blocks = [](std::int64_t length, std::int64_t size) -> std::int64_t {
        return size > 0 ? length / size + (length % size != 0 ? 1 : 0) : 1;
      };
      const std::int64_t qb = blocks(d.lq, bm.q_block_size);
      const std::int64_t kb = blocks(d.lk, bm.kv_block_size);
      const at::ScalarType t = in.ConsumeIntegralInRange<int>(0, 5) == 0 ? dtype(in) : at::kInt;
      bm.kv_num_blocks = tensor(in, {d.b, d.hq, std::min<std::int64_t>(qb, 9)}, t, -1, kb + 1);
      bm.kv_indices =
          tensor(in, {d.b, d.hq, std::min<std::int64_t>(qb, 9), std::min<std::int64_t>(kb, 9)}, t,
                 -1, kb + 1);
      if (in.ConsumeBool()) {
        bm.full_kv_num_blocks =
            tensor(in, {d.b, d.hq, std::min<std::int64_t>(qb, 9)}, t, -1, kb + 1);
        bm.full_kv_indices =
            tensor(in, {d.b, d.hq, std::min<std::int64_t>(qb, 9), std::min<std::int64_t>(kb, 9)}, t,
                   -1, kb + 1);
      }
      break;
    }
    case keel::MaskKind::tensor:
      m.tensor = tensor(in, {d.b, d.hq, d.lq, d.lk},
                        in.ConsumeIntegralInRange<int>(0, 5) == 0 ? dtype(in) : at::kBool, 0, 1);
      break;
    default:
      break;
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  Dims d{dim(in), dim(in), dim(in), dim(in), dim(in), dim(in), dim(in)};
  if (in.ConsumeBool()) d.hkv = d.hq;  // grouped-query shapes that divide, often
  const at::ScalarType type = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? dtype(in) : at::kFloat;
  const at::Tensor q = tensor(in, {d.b, d.hq, d.lq, d.e}, type);
  const at::Tensor k = tensor(in, {d.b, d.hkv, d.lk, d.e}, in.ConsumeBool() ? type : dtype(in));
  const at::Tensor v = tensor(in, {d.b, d.hkv, d.lk, d.ev}, type);

  keel::AttentionSpec spec;
  const int terms = in.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < terms; ++i) spec.masks.push_back(mask(in, d));
  spec.combine = static_cast<keel::MaskCombine>(in.ConsumeIntegralInRange<std::uint8_t>(0, 2));
  if (in.ConsumeBool()) spec.scale = real(in);
  if (in.ConsumeBool()) spec.softcap = real(in);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    spec.alibi_slopes = tensor(in, {d.hq}, in.ConsumeBool() ? at::kFloat : dtype(in));
  spec.alibi_alignment = alignment(in);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    spec.bias = tensor(in, {d.b, d.hq, d.lq, d.lk}, in.ConsumeBool() ? type : dtype(in));
  spec.return_lse = in.ConsumeBool();
  spec.dispatch.backend = keel::fuzz::backend(in);
  const bool grad =
      in.ConsumeBool() && q.defined() && at::isFloatingType(q.scalar_type()) && !q.is_meta();

  at::Tensor q_in = q;
  if (grad) q_in = q.detach().requires_grad_(true);
  const keel::result<keel::AttentionOutput> r = keel::attention(q_in, k, v, spec);
  if (!r) return 0;
  // A value: shaped [B, Hq, Lq, Ev] like the inputs that were accepted.
  const at::Tensor& out = r.value().out;
  if (out.dim() != 4 || out.size(0) != q.size(0) || out.size(1) != q.size(1) ||
      out.size(2) != q.size(2) || out.size(3) != v.size(3)) {
    __builtin_trap();
  }
  if (spec.return_lse && !r.value().lse.defined()) __builtin_trap();
  if (grad && out.requires_grad()) out.sum().backward();
  return 0;
}
