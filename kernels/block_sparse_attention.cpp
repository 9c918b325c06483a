#include "block_sparse_attention.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "accumulation.h"
#include "attention_mask.h"
#include "attention_route.h"
#include "flash_plan.h"
#include "row_softmax.h"
#include "score_modifiers.h"

namespace keel::kernels {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// Query i and key j of head h read kv head h / (Hq / Hkv): repeat each kv
// head for its group of query heads.
at::Tensor expand_heads(const at::Tensor& t, std::int64_t q_heads) {
  const std::int64_t kv_heads = t.size(1);
  if (kv_heads == q_heads) return t;
  const std::int64_t group = q_heads / kv_heads;
  return t.unsqueeze(2)
      .expand({t.size(0), kv_heads, group, t.size(2), t.size(3)})
      .reshape({t.size(0), q_heads, t.size(2), t.size(3)});
}

// The general tile loop on plain ATen ops, differentiable through autograd:
// for the calls the flash kernel cannot serve (score modifiers, another
// device, Ev != E).
AttentionOutput tile_loop_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const AttentionSpec& spec, double scale) {
  const at::ScalarType acc = accumulation_dtype(q.scalar_type());
  const std::int64_t batch = q.size(0);
  const std::int64_t q_heads = q.size(1);
  const std::int64_t q_len = q.size(2);
  const std::int64_t kv_len = k.size(2);
  const std::int64_t value_dim = v.size(3);
  const at::TensorOptions acc_options = q.options().dtype(acc);

  AttentionOutput result;
  if (q_len == 0 || kv_len == 0) {
    // No keys: every row is fully masked. Multiplying by q keeps the output
    // on the graph, so that backward gives zero gradients, not an error.
    const at::Tensor zero = zero_tied_to_inputs(q.to(acc), k.to(acc), v.to(acc), spec);
    result.out =
        (at::zeros({batch, q_heads, q_len, value_dim}, acc_options) + zero).to(q.scalar_type());
    result.lse = at::full({batch, q_heads, q_len}, kMinusInf, acc_options);
    result.visible_fraction = 0.0;
    return result;
  }

  // The scale is folded into q: [Lq, E] multiplications instead of [Lq, Lk].
  const at::Tensor qf = q.to(acc) * scale;
  const at::Tensor kf = expand_heads(k.to(acc), q_heads);
  const at::Tensor vf = expand_heads(v.to(acc), q_heads);

  const MaskGeometry geometry{batch, q_heads, q_len, kv_len};
  const auto [bq, bk] = block_sizes(spec);
  const std::int64_t q_blocks = block_count(q_len, bq);
  const std::int64_t kv_blocks = block_count(kv_len, bk);

  // Classify (query block, key block) pairs over every batch and head at
  // once: a key block is skipped when no (b, h) sees any of it, and needs no
  // masking when every (b, h) sees all of it.
  const BlockClasses classes = classify_blocks(spec, geometry, q.device(), bq, bk);
  const at::Tensor& visible = classes.visible;
  const at::Tensor& full = classes.full;
  const auto visible_a = visible.accessor<bool, 2>();
  const auto full_a = full.accessor<bool, 2>();

  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> lses;
  outs.reserve(static_cast<std::size_t>(q_blocks));
  lses.reserve(static_cast<std::size_t>(q_blocks));
  std::int64_t multiplied = 0;
  // Skipped query blocks are 0, tied to the inputs by a zero multiple, so
  // that backward reaches q, k and v even when every block is skipped.
  at::Tensor anchor;
  const at::TensorOptions index = q.options().dtype(at::kLong);
  for (std::int64_t qb = 0; qb < q_blocks; ++qb) {
    const std::int64_t q0 = qb * bq;
    const std::int64_t rows = std::min(bq, q_len - q0);
    std::vector<std::int64_t> blocks;
    blocks.reserve(static_cast<std::size_t>(kv_blocks));
    bool needs_mask = false;
    for (std::int64_t kb = 0; kb < kv_blocks; ++kb) {
      if (!visible_a[qb][kb]) continue;
      blocks.push_back(kb);
      needs_mask = needs_mask || !full_a[qb][kb];
    }
    if (blocks.empty()) {
      if (!anchor.defined()) anchor = zero_tied_to_inputs(qf, kf, vf, spec);
      outs.push_back(at::zeros({batch, q_heads, rows, value_dim}, acc_options) + anchor);
      lses.push_back(at::full({batch, q_heads, rows, 1}, kMinusInf, acc_options));
      continue;
    }
    multiplied += static_cast<std::int64_t>(blocks.size());
    // A contiguous run of key blocks is a view; scattered blocks are gathered.
    const std::int64_t k0 = blocks.front() * bk;
    const std::int64_t k1 = std::min(kv_len, (blocks.back() + 1) * bk);
    const bool contiguous =
        blocks.back() - blocks.front() + 1 == static_cast<std::int64_t>(blocks.size());
    at::Tensor keys;
    if (contiguous) {
      keys = at::arange(k0, k1, index);
    } else {
      std::vector<at::Tensor> parts;
      parts.reserve(blocks.size());
      for (std::int64_t kb : blocks) {
        parts.push_back(at::arange(kb * bk, std::min(kv_len, (kb + 1) * bk), index));
      }
      keys = at::cat(parts);
    }
    const at::Tensor kt = contiguous ? kf.narrow(2, k0, k1 - k0) : kf.index_select(2, keys);
    const at::Tensor vt = contiguous ? vf.narrow(2, k0, k1 - k0) : vf.index_select(2, keys);
    const at::Tensor qt = qf.narrow(2, q0, rows);

    at::Tensor s = at::matmul(qt, kt.transpose(-2, -1));
    if (spec.softcap > 0) s = (s / spec.softcap).tanh() * spec.softcap;
    s = add_score_modifiers(s, spec, q0, rows, keys, q_len, kv_len);
    if (needs_mask) {
      s = s.masked_fill(materialize_tile(spec, geometry, q0, rows, keys).logical_not(), kMinusInf);
    }
    const RowSoftmax p = row_softmax(s);
    outs.push_back(at::matmul(p.weights_unnormalised, vt) / p.denominator);
    lses.push_back(p.lse);
  }
  result.out = at::cat(outs, 2).to(q.scalar_type());
  result.lse = at::cat(lses, 2).squeeze(-1);
  result.visible_fraction =
      static_cast<double>(multiplied) / static_cast<double>(q_blocks * kv_blocks);
  return result;
}

// ---------------------------------------------------------------------------
// The flash route: the calls flash_plan.h plans, run over views of q, k and v.

// What backward needs besides the tensors: the calls and the scale.
struct FlashPlan final : torch::CustomClassHolder {
  std::vector<FlashGroup> groups;
  double scale = 1.0;
};

// [nb * H, count, len, D] view of a contiguous [B, H, L, D] tensor: segment
// i of batch-head n starts at row start + i * step.
at::Tensor segments(const at::Tensor& t, std::int64_t b0, std::int64_t nb, std::int64_t start,
                    std::int64_t step, std::int64_t count, std::int64_t len) {
  const std::int64_t heads = t.size(1);
  const std::int64_t length = t.size(2);
  const std::int64_t dim = t.size(3);
  return t.as_strided({nb * heads, count, len, dim}, {length * dim, step * dim, dim, 1},
                      t.storage_offset() + (b0 * heads * length + start) * dim);
}

at::Tensor q_view(const at::Tensor& t, const FlashGroup& g) {
  return segments(t, g.b0, g.nb, g.q0, g.q_step, g.count, g.rows);
}

at::Tensor k_view(const at::Tensor& t, const FlashGroup& g) {
  return segments(t, g.b0, g.nb, g.k0, g.k_step, g.count, g.len);
}

// The same view of a [B, H, L] tensor: [nb * H, count, len].
at::Tensor q_view_rows(const at::Tensor& t, const FlashGroup& g) {
  return q_view(t.unsqueeze(-1), g).squeeze(-1);
}

// Adds the kernel's key gradient [nb * H, count, len, D] into `grad`. Key
// ranges of one group may overlap (k_step < len): they are added in slices of
// k_step keys, each of which is a non-overlapping view.
void add_key_gradient(const at::Tensor& grad, const FlashGroup& g, const at::Tensor& part) {
  if (g.count == 1 || g.k_step >= g.len) {
    k_view(grad, g).add_(part);
    return;
  }
  if (g.k_step == 0) {
    segments(grad, g.b0, g.nb, g.k0, g.len, 1, g.len).add_(part.sum(1, /*keepdim=*/true));
    return;
  }
  for (std::int64_t c0 = 0; c0 < g.len; c0 += g.k_step) {
    const std::int64_t n = std::min(g.k_step, g.len - c0);
    segments(grad, g.b0, g.nb, g.k0 + c0, g.k_step, g.count, n).add_(part.narrow(2, c0, n));
  }
}

std::optional<at::Tensor> mask_of(const FlashGroup& g) {
  return g.mask.defined() ? std::optional<at::Tensor>(g.mask) : std::nullopt;
}

c10::intrusive_ptr<FlashPlan> make_plan(const at::Tensor& q, const at::Tensor& k,
                                        const AttentionSpec& spec, double scale,
                                        at::ScalarType dtype) {
  auto plan = c10::make_intrusive<FlashPlan>();
  plan->scale = scale;
  plan->groups =
      plan_flash_groups(spec, MaskGeometry{q.size(0), q.size(1), q.size(2), k.size(2)}, dtype);
  return plan;
}

// Out and log-sum-exp of every group, written into `out` [B, Hq, Lq, E] and
// `lse` [B, Hq, Lq] (rows no group reaches stay 0 and -inf).
void run_plan_forward(const FlashPlan& plan, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse) {
  for (const FlashGroup& g : plan.groups) {
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
        q_view(q, g), k_view(k, g), k_view(v, g), 0.0, g.causal, mask_of(g), plan.scale);
    if (g.nonempty.defined()) l = l.masked_fill(g.nonempty.logical_not(), kMinusInf);
    at::Tensor ov = q_view(out, g);
    at::Tensor lv = q_view_rows(lse, g);
    if (!g.merge) {
      ov.copy_(o);
      lv.copy_(l);
      continue;
    }
    // The softmax over the union of two key sets, from each set's out and
    // lse: weights exp(lse_part - lse_union), in place, two passes over the
    // outputs. A row empty in both keeps lse -inf and out 0 (its weights,
    // exp(nan), are zeroed).
    const at::Tensor both = at::logaddexp(lv, l);
    const at::Tensor w_old = (lv - both).exp_().nan_to_num_(0.0);
    const at::Tensor w_new = (l - both).exp_().nan_to_num_(0.0);
    ov.mul_(w_old.unsqueeze(-1)).addcmul_(o, w_new.unsqueeze(-1));
    lv.copy_(both);
  }
}

// The flash route as one autograd node: forward runs the plan; backward runs
// the kernel's backward per group against the merged out and log-sum-exp
// (the softmax of a row split across groups is normalised by the whole row),
// and a second pass for the log-sum-exp's gradient when it has one.
class FlashBlockSparse : public torch::autograd::Function<FlashBlockSparse> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v,
                                                const c10::intrusive_ptr<FlashPlan>& plan) {
    at::Tensor out = at::zeros(q.sizes(), q.options());
    at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, kMinusInf, q.options());
    run_plan_forward(*plan, q, k, v, out, lse);
    // The kernel's backward recomputes exp(s - lse): an empty row needs a
    // finite lse there (its scores are all -inf, so any value gives 0).
    const at::Tensor lse_backward = lse.masked_fill(lse.isneginf(), 0.0);
    ctx->save_for_backward({q, k, v, out, lse_backward});
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan);
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& k = saved[1];
    const at::Tensor& v = saved[2];
    const at::Tensor& out = saved[3];
    const at::Tensor& lse = saved[4];
    const auto plan =
        c10::static_intrusive_pointer_cast<FlashPlan>(ctx->saved_data["plan"].toCapsule());
    at::Tensor dq = at::zeros_like(q);
    at::Tensor dk = at::zeros_like(k);
    at::Tensor dv = at::zeros_like(v);
    const auto pass = [&](const at::Tensor& d_out, const at::Tensor& values,
                          const at::Tensor& outputs, bool value_gradient) {
      for (const FlashGroup& g : plan->groups) {
        const auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            q_view(d_out, g), q_view(q, g), k_view(k, g), k_view(values, g), q_view(outputs, g),
            q_view_rows(lse, g), 0.0, g.causal, mask_of(g), plan->scale);
        q_view(dq, g).add_(gq);
        add_key_gradient(dk, g, gk);
        if (value_gradient) add_key_gradient(dv, g, gv);
      }
    };
    if (grads[0].defined()) pass(grads[0].contiguous(), v, out, true);
    if (grads.size() > 1 && grads[1].defined()) {
      // d lse / d s = softmax: the kernel's backward with values 0, and an
      // output and upstream gradient whose row dot product is -grad_lse,
      // gives dS = P * grad_lse, hence the lse's share of dq and dk.
      at::Tensor d_out = at::zeros_like(q);
      d_out.select(-1, 0).copy_(-grads[1]);
      at::Tensor ones = at::zeros_like(q);
      ones.select(-1, 0).fill_(1.0);
      pass(d_out, at::zeros_like(v), ones, false);
    }
    return {dq, dk, dv, at::Tensor()};
  }
};

AttentionOutput flash_block_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionSpec& spec, double scale) {
  const at::ScalarType acc = accumulation_dtype(q.scalar_type());
  const std::int64_t q_heads = q.size(1);
  const at::Tensor qf = q.to(acc).contiguous();
  const at::Tensor kf = expand_heads(k.to(acc), q_heads).contiguous();
  const at::Tensor vf = expand_heads(v.to(acc), q_heads).contiguous();
  const c10::intrusive_ptr<FlashPlan> plan = make_plan(q, k, spec, scale, acc);
  const auto outputs = FlashBlockSparse::apply(qf, kf, vf, plan);
  AttentionOutput result;
  result.out = outputs[0].to(q.scalar_type());
  result.lse = outputs[1];
  double computed = 0;
  for (const FlashGroup& g : plan->groups) {
    const double keys =
        g.causal ? 0.5 * static_cast<double>(g.len + 1) : static_cast<double>(g.len);
    computed += static_cast<double>(g.nb * g.count * g.rows) * keys;
  }
  result.visible_fraction = computed / static_cast<double>(q.size(0) * q.size(2) * k.size(2));
  result.kernel_calls = static_cast<std::int64_t>(plan->groups.size());
  return result;
}

}  // namespace

AttentionOutput block_sparse_attention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const AttentionSpec& spec,
                                       double scale) {
  if (!block_sparse_on_flash(q, k, v, spec)) {
    AttentionOutput r = tile_loop_attention(q, k, v, spec, scale);
    r.kernel_calls = -1;
    return r;
  }
  return flash_block_attention(q, k, v, spec, scale);
}

}  // namespace keel::kernels
