// The attention family: every mask kind and score modifier, GQA, Lq != Lk,
// odd shapes, fp32 and bf16; serving shapes (decode and speculative
// verification against a cache, chunked prefill, 32 query heads over 8 or 1
// kv heads, head dim 128; a paged cache, forward only; packed ragged
// queries of a serving step against a paged cache, and the varlen layout of
// packed keys); forward (out, lse) and the gradients of q, k, v.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/autograd/autograd.h>

#include "engine/peak_memory.h"
#include "keel/v1/attention.h"
#include "suite/suite.h"

namespace keel::harness {
namespace {

struct Shape {
  std::int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;
};

class AttentionFamily final : public Family {
 public:
  std::string operation() const override { return "attention"; }

  std::vector<Case> make_cases() const override {
    std::vector<Case> cases;
    at::manual_seed(20261203);
    const Shape base{2, 4, 2, 192, 192, 32};
    const Shape odd{1, 3, 1, 77, 131, 24};
    // (name, mask, shape, options)
    struct Spec {
      const char* name;
      Shape shape;
      nlohmann::json options;
    };
    const Spec specs[] = {
        {"none", base, {{"mask", "none"}}},
        {"causal", base, {{"mask", "causal"}}},
        {"causal_bottom_right_decode",
         {2, 4, 2, 16, 192, 32},
         {{"mask", "causal"}, {"alignment", "bottom_right"}}},
        {"sliding_window_48", base, {{"mask", "sliding_window"}, {"left", 48}, {"right", 0}}},
        {"chunked_causal_64", base, {{"mask", "chunked_causal"}, {"chunk", 64}}},
        {"prefix_lm", base, {{"mask", "prefix_lm"}}},
        {"document", base, {{"mask", "document"}}},
        {"key_padding", base, {{"mask", "key_padding"}}},
        {"causal_softcap", base, {{"mask", "causal"}, {"softcap", 20.0}}},
        {"causal_alibi", base, {{"mask", "causal"}, {"alibi", true}}},
        {"odd_shapes_mqa", odd, {{"mask", "causal"}, {"alignment", "bottom_right"}}},
        {"decode_gqa32_8",
         {2, 32, 8, 1, 1024, 128},
         {{"mask", "causal"}, {"alignment", "bottom_right"}}},
        {"decode_gqa32_8_ragged",
         {3, 32, 8, 1, 1024, 128},
         {{"mask", "causal"}, {"alignment", "bottom_right"}, {"kv_padding", true}}},
        {"decode_mqa32_1_window_256",
         {2, 32, 1, 1, 1024, 128},
         {{"mask", "sliding_window"}, {"left", 256}, {"right", 0}, {"alignment", "bottom_right"}}},
        {"verify_gqa32_8_lq5",
         {1, 32, 8, 5, 777, 128},
         {{"mask", "causal"}, {"alignment", "bottom_right"}}},
        {"chunked_prefill_gqa32_8_lq128",
         {1, 32, 8, 128, 1024, 128},
         {{"mask", "causal"}, {"alignment", "bottom_right"}}},
        // Paged caches (kv_len: the table's keys): ragged lengths, shuffled pages.
        {"paged_decode_gqa32_8_page16",
         {3, 32, 8, 1, 1024, 128},
         {{"mask", "causal"}, {"alignment", "bottom_right"}, {"page_size", 16}}},
        {"paged_verify_gqa32_8_lq5_page64_window_256",
         {2, 32, 8, 5, 1024, 128},
         {{"mask", "sliding_window"},
          {"left", 256},
          {"right", 0},
          {"alignment", "bottom_right"},
          {"page_size", 64}}},
        // Packed ragged queries (q [T, Hq, E] with cu_seqlens_q): a serving
        // step of decodes, a speculative verify, an empty sequence and a
        // prefill chunk over a paged cache; and the varlen layout (packed
        // keys with cu_seqlens_k, forward and backward).
        {"packed_paged_step_gqa32_8_page16",
         {4, 32, 8, 0, 512, 128},
         {{"mask", "causal"},
          {"alignment", "bottom_right"},
          {"page_size", 16},
          {"packed_q_lens", {1, 5, 0, 64}}}},
        {"packed_varlen_gqa32_8_window_64",
         {3, 32, 8, 0, 0, 128},
         {{"mask", "sliding_window"},
          {"left", 64},
          {"right", 0},
          {"alignment", "bottom_right"},
          {"packed_q_lens", {7, 1, 40}},
          {"packed_k_lens", {90, 33, 40}}}},
    };
    for (const auto& [type, dtype] :
         {std::pair{at::kFloat, "float32"}, std::pair{at::kBFloat16, "bfloat16"}}) {
      for (const Spec& s : specs) {
        Case c;
        c.id = absl::StrCat("attention/", dtype, "/", s.name);
        c.operation = operation();
        c.dtype = dtype;
        c.options = s.options;
        const Shape& sh = s.shape;
        c.inputs["q"] = at::randn({sh.batch, sh.q_heads, sh.q_len, sh.head_dim}).to(type);
        c.inputs["k"] = at::randn({sh.batch, sh.kv_heads, sh.kv_len, sh.head_dim}).to(type);
        c.inputs["v"] = at::randn({sh.batch, sh.kv_heads, sh.kv_len, sh.head_dim}).to(type);
        c.inputs["upstream"] = at::randn({sh.batch, sh.q_heads, sh.q_len, sh.head_dim});
        const std::string mask = s.options.value("mask", "");
        if (mask == "prefix_lm")
          c.inputs["prefix_lengths"] = at::randint(1, sh.q_len, {sh.batch}, at::kLong);
        if (mask == "key_padding" || s.options.value("kv_padding", false))
          c.inputs["kv_lengths"] = at::randint(1, sh.kv_len + 1, {sh.batch}, at::kLong);
        if (mask == "document") {
          // Packed sequences: sorted ids, documents of random lengths.
          const at::Tensor ids =
              std::get<0>(at::randint(0, 5, {sh.batch, sh.q_len}, at::kLong).sort(-1));
          c.inputs["q_document_ids"] = ids;
          c.inputs["kv_document_ids"] = ids;
        }
        if (s.options.value("alibi", false))
          c.inputs["alibi_slopes"] = at::rand({sh.q_heads}) * 0.5;
        if (s.options.contains("packed_q_lens")) pack(c, sh, type);
        if (const std::int64_t page = s.options.value("page_size", 0); page > 0) {
          // The keys of k and v become pages of a pool in shuffled order.
          const std::int64_t per = sh.kv_len / page;
          const at::Tensor slot_of = at::randperm(sh.batch * per, at::kLong);
          at::Tensor k_pages = at::empty({sh.batch * per, sh.kv_heads, page, sh.head_dim}, type);
          at::Tensor v_pages = at::empty_like(k_pages);
          for (std::int64_t n = 0; n < sh.batch * per; ++n) {
            const std::int64_t b = n / per;
            const std::int64_t j = n % per;
            k_pages[slot_of[n].item<std::int64_t>()].copy_(
                c.inputs["k"][b].narrow(1, j * page, page));
            v_pages[slot_of[n].item<std::int64_t>()].copy_(
                c.inputs["v"][b].narrow(1, j * page, page));
          }
          c.inputs.erase("k");
          c.inputs.erase("v");
          c.inputs.erase("upstream");
          c.inputs["k_pages"] = k_pages;
          c.inputs["v_pages"] = v_pages;
          c.inputs["page_table"] = slot_of.view({sh.batch, per});
          c.inputs["lengths"] = at::randint(0, sh.kv_len + 1, {sh.batch}, at::kLong);
        }
        cases.push_back(std::move(c));
      }
    }
    return cases;
  }

  result<Run> run(const Case& c, Backend backend) const override {
    const auto alignment = c.options.value("alignment", "top_left") == "bottom_right"
                               ? CausalAlignment::bottom_right
                               : CausalAlignment::top_left;
    AttentionSpec spec;
    const std::string mask = c.options.value("mask", "none");
    if (mask == "causal") spec.masks.push_back(Mask::causal(alignment));
    if (mask == "sliding_window") {
      spec.masks.push_back(
          Mask::sliding_window(c.options.value("left", 0), c.options.value("right", 0), alignment));
    }
    if (mask == "chunked_causal")
      spec.masks.push_back(Mask::chunked_causal(c.options.value("chunk", 1), alignment));
    if (mask == "prefix_lm")
      spec.masks.push_back(Mask::prefix_lm(c.inputs.at("prefix_lengths"), alignment));
    if (mask == "document") {
      spec.masks.push_back(
          Mask::document(c.inputs.at("q_document_ids"), c.inputs.at("kv_document_ids")));
    }
    if (mask == "key_padding" || c.options.value("kv_padding", false))
      spec.masks.push_back(Mask::key_padding(c.inputs.at("kv_lengths")));
    spec.softcap = c.options.value("softcap", 0.0);
    if (c.options.value("alibi", false)) spec.alibi_slopes = c.inputs.at("alibi_slopes");
    spec.return_lse = true;
    spec.dispatch.backend = backend;
    if (c.inputs.count("page_table") != 0) return run_paged(c, spec);
    if (c.inputs.count("cu_seqlens_k") != 0) return run_varlen(c, spec);

    return with_gradients(c, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return attention(q, k, v, spec);
    });
  }

 private:
  // Offsets [n + 1] of counts [n].
  static at::Tensor offsets(const std::vector<std::int64_t>& counts) {
    std::vector<std::int64_t> cu{0};
    for (std::int64_t n : counts) cu.push_back(cu.back() + n);
    return at::tensor(cu, at::kLong);
  }

  // Packs the queries as [T, Hq, E] (and, without pages, the keys and
  // values as [S, Hkv, E]) with their offsets.
  static void pack(Case& c, const Shape& sh, at::ScalarType type) {
    const auto q_lens = c.options.at("packed_q_lens").get<std::vector<std::int64_t>>();
    const at::Tensor cu_q = offsets(q_lens);
    const auto t = cu_q[-1].item<std::int64_t>();
    c.inputs["q"] = at::randn({t, sh.q_heads, sh.head_dim}).to(type);
    c.inputs["cu_seqlens_q"] = cu_q;
    c.inputs["upstream"] = at::randn({t, sh.q_heads, sh.head_dim});
    if (!c.options.contains("packed_k_lens")) return;
    const at::Tensor cu_k = offsets(c.options.at("packed_k_lens").get<std::vector<std::int64_t>>());
    const auto keys = cu_k[-1].item<std::int64_t>();
    c.inputs["k"] = at::randn({keys, sh.kv_heads, sh.head_dim}).to(type);
    c.inputs["v"] = at::randn({keys, sh.kv_heads, sh.head_dim}).to(type);
    c.inputs["cu_seqlens_k"] = cu_k;
  }

  // The varlen layout: forward and the gradients of q, k, v.
  static result<Run> run_varlen(const Case& c, const AttentionSpec& spec) {
    return with_gradients(c, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return attention(PackedQueries{q, c.inputs.at("cu_seqlens_q")},
                       PackedKeys{k, v, c.inputs.at("cu_seqlens_k")}, spec);
    });
  }

  // `call(q, k, v)` on leaves that require grad: its forward (out, lse) and
  // the gradients of q, k, v for the case's upstream gradient.
  template <class Call>
  static result<Run> with_gradients(const Case& c, const Call& call) {
    const at::Tensor q = c.inputs.at("q").detach().clone().requires_grad_(true);
    const at::Tensor k = c.inputs.at("k").detach().clone().requires_grad_(true);
    const at::Tensor v = c.inputs.at("v").detach().clone().requires_grad_(true);
    Run run;
    PeakMemory memory;
    auto start = std::chrono::steady_clock::now();
    result<AttentionOutput> out = call(q, k, v);
    run.forward_ms = elapsed_ms(start);
    if (!out) return out.error();
    run.adapter = out.value().dispatch.adapter;
    const at::Tensor upstream = c.inputs.at("upstream").to(out.value().out.scalar_type());
    start = std::chrono::steady_clock::now();
    const auto grads = torch::autograd::grad({out.value().out}, {q, k, v}, {upstream});
    run.backward_ms = elapsed_ms(start);
    run.peak_bytes = memory.peak_bytes();
    run.outputs["out"] = out.value().out.detach();
    run.outputs["lse"] = out.value().lse.detach();
    run.outputs["grad_q"] = grads[0];
    run.outputs["grad_k"] = grads[1];
    run.outputs["grad_v"] = grads[2];
    return run;
  }

  // A paged cache is an inference call: forward only.
  static result<Run> run_paged(const Case& c, const AttentionSpec& spec) {
    const at::NoGradGuard no_grad;
    PagedKVCache cache;
    cache.k_pages = c.inputs.at("k_pages");
    cache.v_pages = c.inputs.at("v_pages");
    cache.page_table = c.inputs.at("page_table");
    cache.lengths = c.inputs.at("lengths");
    Run run;
    PeakMemory memory;
    const auto start = std::chrono::steady_clock::now();
    result<AttentionOutput> out =
        c.inputs.count("cu_seqlens_q") != 0
            ? attention(PackedQueries{c.inputs.at("q"), c.inputs.at("cu_seqlens_q")}, cache, spec)
            : attention(c.inputs.at("q"), cache, spec);
    run.forward_ms = elapsed_ms(start);
    if (!out) return out.error();
    run.adapter = out.value().dispatch.adapter;
    run.peak_bytes = memory.peak_bytes();
    run.outputs["out"] = out.value().out;
    run.outputs["lse"] = out.value().lse;
    return run;
  }
};

}  // namespace

std::unique_ptr<Family> make_attention_family() {
  return std::make_unique<AttentionFamily>();
}

}  // namespace keel::harness
