// The attention calls of the C ABI (keel.h, "attention"): forward, the
// explicit backward, and the paged and packed-paged serving calls.
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "common.h"
#include "device.h"

namespace keel::c_api {
namespace {

result<AttentionSpec> spec_of(const KEEL_AttentionSpec* c_spec, Inputs& in) {
  AttentionSpec spec;
  if (c_spec == nullptr) return spec;
  result<KEEL_AttentionSpec> s = sized(c_spec, "spec");
  if (!s) return s.error();
  const KEEL_AttentionSpec& c = s.value();
  if (c.num_masks > 0 && c.masks == nullptr) {
    return Error(Errc::invalid_argument, "spec.masks is NULL with num_masks > 0");
  }
  for (std::size_t i = 0; i < c.num_masks; ++i) {
    const std::string name = "spec.masks[" + std::to_string(i) + "]";
    result<KEEL_Mask> m = sized(c.masks[i], name);
    if (!m) return m.error();
    const KEEL_Mask& cm = m.value();
    if (cm.kind < KEEL_MASK_CAUSAL || cm.kind > KEEL_MASK_TENSOR) {
      return Error(Errc::invalid_argument,
                   name + ".kind is " + std::to_string(cm.kind) + ", not a KEEL_MaskKind");
    }
    Mask mask;
    mask.kind = static_cast<MaskKind>(cm.kind);
    result<CausalAlignment> a = alignment_of(cm.alignment, name + ".alignment");
    if (!a) return a.error();
    mask.alignment = a.value();
    mask.window_left = cm.window_left;
    mask.window_right = cm.window_right;
    mask.chunk_size = cm.chunk_size;
    mask.block.q_block_size = cm.q_block_size > 0 ? cm.q_block_size : 128;
    mask.block.kv_block_size = cm.kv_block_size > 0 ? cm.kv_block_size : 128;
    const std::pair<at::Tensor*, std::pair<const DLManagedTensorVersioned*, const char*>> fields[] =
        {
            {&mask.prefix_lengths, {cm.prefix_lengths, ".prefix_lengths"}},
            {&mask.q_document_ids, {cm.q_document_ids, ".q_document_ids"}},
            {&mask.kv_document_ids, {cm.kv_document_ids, ".kv_document_ids"}},
            {&mask.kv_lengths, {cm.kv_lengths, ".kv_lengths"}},
            {&mask.block.kv_num_blocks, {cm.kv_num_blocks, ".kv_num_blocks"}},
            {&mask.block.kv_indices, {cm.kv_indices, ".kv_indices"}},
            {&mask.block.full_kv_num_blocks, {cm.full_kv_num_blocks, ".full_kv_num_blocks"}},
            {&mask.block.full_kv_indices, {cm.full_kv_indices, ".full_kv_indices"}},
            {&mask.tensor, {cm.tensor, ".tensor"}},
        };
    for (const auto& [field, source] : fields) {
      result<at::Tensor> t = in.take(source.first, name + source.second, /*optional=*/true);
      if (!t) return t.error();
      *field = t.value();
    }
    spec.masks.push_back(std::move(mask));
  }
  spec.combine = c.combine_any != 0 ? MaskCombine::any_of : MaskCombine::all_of;
  spec.scale = c.scale;
  spec.softcap = c.softcap;
  result<at::Tensor> slopes = in.take(c.alibi_slopes, "spec.alibi_slopes", true);
  if (!slopes) return slopes.error();
  spec.alibi_slopes = slopes.value();
  result<CausalAlignment> a = alignment_of(c.alibi_alignment, "spec.alibi_alignment");
  if (!a) return a.error();
  spec.alibi_alignment = a.value();
  result<at::Tensor> bias = in.take(c.bias, "spec.bias", true);
  if (!bias) return bias.error();
  spec.bias = bias.value();
  result<Backend> b = backend_of(c.backend, "spec.backend");
  if (!b) return b.error();
  spec.dispatch.backend = b.value();
  return spec;
}

// The paged cache of a paged call's arguments (both name its fields alike).
template <class Args>
result<PagedKVCache> cache_of(const Args& a, Inputs& in) {
  PagedKVCache cache;
  const std::pair<at::Tensor*, std::pair<const DLManagedTensorVersioned*, const char*>> fields[] = {
      {&cache.k_pages, {a.k_pages, "k_pages"}},
      {&cache.v_pages, {a.v_pages, "v_pages"}},
      {&cache.page_table, {a.page_table, "page_table"}},
      {&cache.lengths, {a.lengths, "lengths"}},
  };
  for (const auto& [field, source] : fields) {
    result<at::Tensor> t = in.take(source.first, source.second);
    if (!t) return t.error();
    *field = t.value();
  }
  return cache;
}

// An attention call's outputs, staged for the caller.
template <class Args>
KEEL_Error* give_attention(Outputs<Args>& out, const Inputs& in, const AttentionOutput& r) {
  out.tensor(&Args::out, in.give(r.out));
  out.tensor(&Args::lse, in.give(r.lse));
  out.set(&Args::served_backend, served(r.dispatch));
  return out.commit();
}

}  // namespace

KEEL_Error* attention_forward(KEEL_Attention_Forward_Args* args) noexcept {
  return guarded("KEEL_Attention_Forward", [&]() -> KEEL_Error* {
    using A = KEEL_Attention_Forward_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::out, &A::lse, &A::served_backend);
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(k, in.take(a.k, "k"));
    KEEL_TRY(v, in.take(a.v, "v"));
    KEEL_TRY(spec, spec_of(a.spec, in));
    spec.return_lse = a.return_lse != 0;
    KEEL_TRY(r, attention(q, k, v, spec));
    return give_attention(out, in, r);
  });
}

KEEL_Error* attention_backward(KEEL_Attention_Backward_Args* args) noexcept {
  return guarded("KEEL_Attention_Backward", [&]() -> KEEL_Error* {
    using A = KEEL_Attention_Backward_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::dq, &A::dk, &A::dv, &A::dbias);
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(k, in.take(a.k, "k"));
    KEEL_TRY(v, in.take(a.v, "v"));
    KEEL_TRY(dout, in.take(a.dout, "dout"));
    KEEL_TRY(spec, spec_of(a.spec, in));
    c10::AutoGradMode grad_mode(true);
    const at::Tensor qg = q.detach().requires_grad_(true);
    const at::Tensor kg = k.detach().requires_grad_(true);
    const at::Tensor vg = v.detach().requires_grad_(true);
    at::Tensor bias;
    if (spec.bias.defined()) {
      bias = spec.bias.detach().requires_grad_(true);
      spec.bias = bias;
    }
    KEEL_TRY(r, attention(qg, kg, vg, spec));
    if (!dout.sizes().equals(r.out.sizes())) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "dout must have out's shape [" +
                                                        c10::str(r.out.sizes()) + "], got [" +
                                                        c10::str(dout.sizes()) + "]");
    }
    r.out.backward(dout.to(r.out.scalar_type()));
    const auto grad = [](const at::Tensor& t) {
      return t.grad().defined() ? t.grad() : at::zeros_like(t);
    };
    out.tensor(&A::dq, in.give(grad(qg)));
    out.tensor(&A::dk, in.give(grad(kg)));
    out.tensor(&A::dv, in.give(grad(vg)));
    if (bias.defined()) out.tensor(&A::dbias, in.give(grad(bias)));
    return out.commit();
  });
}

KEEL_Error* attention_paged(KEEL_Attention_Paged_Args* args) noexcept {
  return guarded("KEEL_Attention_Paged", [&]() -> KEEL_Error* {
    using A = KEEL_Attention_Paged_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::out, &A::lse, &A::served_backend);
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(cache, cache_of(a, in));
    KEEL_TRY(spec, spec_of(a.spec, in));
    spec.return_lse = a.return_lse != 0;
    c10::NoGradGuard no_grad;
    KEEL_TRY(r, attention(q, cache, spec));
    return give_attention(out, in, r);
  });
}

KEEL_Error* attention_packed_paged(KEEL_Attention_PackedPaged_Args* args) noexcept {
  return guarded("KEEL_Attention_PackedPaged", [&]() -> KEEL_Error* {
    using A = KEEL_Attention_PackedPaged_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::out, &A::lse, &A::served_backend);
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(cu, in.take(a.cu_seqlens_q, "cu_seqlens_q"));
    KEEL_TRY(cache, cache_of(a, in));
    KEEL_TRY(spec, spec_of(a.spec, in));
    spec.return_lse = a.return_lse != 0;
    c10::NoGradGuard no_grad;
    KEEL_TRY(r, attention(PackedQueries{q, cu}, cache, spec));
    return give_attention(out, in, r);
  });
}

}  // namespace keel::c_api
