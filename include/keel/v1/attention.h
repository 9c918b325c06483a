/// @file keel/v1/attention.h
/// @brief `keel::attention`: scaled dot-product attention with
/// FlexAttention's common masks and score modifiers, declared in C++.
///
/// PyTorch's FlexAttention has no C++ entry point (it is a Python
/// higher-order op compiled at run time). keel offers its common patterns as
/// plain values: a list of mask terms combined with and/or, and a few score
/// modifiers. Dense cases run on `at::scaled_dot_product_attention`; sparse
/// masks run on keel's block-sparse kernel, which skips key blocks that a
/// query block cannot see, so that its cost follows the visible fraction.
///
/// In one line:
/// `auto r = keel::attention(q, k, v, spec);` then `r.value().out`, `r.value().lse`.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp attention_window
///
/// Semantics every adapter keeps, and traps:
/// - Every call's `keel::result` is `[[nodiscard]]`: ignoring one is a
///   warning (an error under `-Werror`); drop one on purpose with `(void)`.
/// - The score of query i and key j is `s = scale * <q_i, k_j>`; then, when
///   `softcap > 0`, `s = softcap * tanh(s / softcap)`; then ALiBi and `bias`
///   are added; then the mask removes what it hides. Softmax and the
///   log-sum-exp accumulate in float32 (float64 for float64 input).
/// - A fully masked row (a query that sees no key, e.g. through key padding
///   of length 0 or a window that misses every key) gives output 0 and
///   log-sum-exp -inf, never NaN, and its gradient is 0. An additive mask
///   passed as `bias` that is -inf on a whole row is a fully masked row too.
/// - Positions: query i sits at position `i` (`CausalAlignment::top_left`)
///   or `i + Lk - Lq` (`CausalAlignment::bottom_right`, decoding with a KV
///   cache: the last query sees the last key). Key j sits at position j.
///   Top-left and bottom-right differ only when Lq != Lk; name the one meant.
/// - Lq = 0 gives an empty output; Lk = 0 makes every row fully masked.
/// - The result is differentiable through autograd with respect to q, k, v
///   and `bias`.
/// - Layouts: every call takes its tensors at any strides a view can have: a
///   transposed `[B, L, H, E]` view, a slice of a fused QKV buffer, a storage
///   offset, a broadcast (stride 0) dimension, a zero-size dimension. keel
///   reads them in place, except a `q`, `k`, `v` (and packed `q`, `k`, `v`)
///   whose last dimension is not at stride 1: that one is first copied to a
///   contiguous tensor (as `at::scaled_dot_product_attention` does), and
///   gradients reach the caller's view through the copy. A paged cache's
///   pools are always read in place, at any strides (a pool whose last
///   dimension is strided is read element by element, never copied).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"
#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {

/// Where the queries sit relative to the keys, for position-based masks.
enum class CausalAlignment : std::uint8_t {
  /// Query i is at position i: causal row i sees keys 0..i.
  top_left = 0,
  /// Query i is at position i + Lk - Lq: causal row i sees keys
  /// 0..i + Lk - Lq (the last query sees every key).
  bottom_right,
};

/// The kind of one mask term.
enum class MaskKind : std::uint8_t {
  /// Key j visible from query position p when j <= p.
  causal = 0,
  /// Key j visible when p - window_left <= j <= p + window_right.
  sliding_window,
  /// Key j visible when j <= p and j, p are in the same chunk of
  /// `chunk_size` positions.
  chunked_causal,
  /// Key j visible when j < prefix_lengths[b] or j <= p.
  prefix_lm,
  /// Key j visible when q_document_ids[b, i] == kv_document_ids[b, j].
  document,
  /// Key j visible when j < kv_lengths[b].
  key_padding,
  /// Key j visible when its block is listed in `block` for query i's block.
  block,
  /// Key j visible when `tensor[b, h, i, j]` is true.
  tensor,
};

/// An explicit block mask in FlexAttention's BlockMask layout. A key block
/// listed for a query block is visible entirely (there is no mask_mod; AND it
/// with another term to refine it).
struct BlockMask {
  /// int32 `[B or 1, Hq or 1, Qb]`: how many partial blocks each query block
  /// lists, Qb = ceil(Lq / q_block_size).
  at::Tensor kv_num_blocks;
  /// int32 `[B or 1, Hq or 1, Qb, KVb]`: the key-block indices, the first
  /// `kv_num_blocks` of each row used, each in [0, ceil(Lk / kv_block_size)).
  at::Tensor kv_indices;
  /// Optional int32 `[B or 1, Hq or 1, Qb]`: the count of full blocks.
  at::Tensor full_kv_num_blocks;
  /// Optional int32 `[B or 1, Hq or 1, Qb, KVb']`: the full blocks' indices.
  at::Tensor full_kv_indices;
  /// Query rows per block.
  std::int64_t q_block_size = 128;
  /// Keys per block.
  std::int64_t kv_block_size = 128;
};

/// One mask term. Build it with the named constructors; a plain struct, so
/// fields can also be set directly.
struct KEEL_API Mask {
  /// Which rule this term applies; the fields it reads are named there.
  MaskKind kind = MaskKind::causal;
  /// Query positions for causal, sliding_window, chunked_causal, prefix_lm.
  CausalAlignment alignment = CausalAlignment::top_left;
  /// Keys visible before the query position (sliding_window), >= 0.
  std::int64_t window_left = 0;
  /// Keys visible after the query position (sliding_window), >= 0.
  std::int64_t window_right = 0;
  /// Positions per chunk (chunked_causal), > 0.
  std::int64_t chunk_size = 0;
  /// Integer `[B]` (prefix_lm): the bidirectional prefix length per batch.
  at::Tensor prefix_lengths;
  /// Integer `[B, Lq]` (document): the query tokens' document ids.
  at::Tensor q_document_ids;
  /// Integer `[B, Lk]` (document): the keys' document ids.
  at::Tensor kv_document_ids;
  /// Integer `[B]` (key_padding): valid keys per batch, in [0, Lk].
  at::Tensor kv_lengths;
  /// The block mask (block).
  BlockMask block;
  /// Bool, broadcastable to `[B, Hq, Lq, Lk]` (tensor): true keeps an entry.
  /// An additive float mask goes in `AttentionSpec::bias` instead.
  at::Tensor tensor;

  /// A causal term.
  static Mask causal(CausalAlignment alignment = CausalAlignment::top_left);
  /// A sliding window of `left` keys before and `right` keys after the query.
  static Mask sliding_window(std::int64_t left, std::int64_t right,
                             CausalAlignment alignment = CausalAlignment::top_left);
  /// Causal attention within chunks of `chunk_size` positions.
  static Mask chunked_causal(std::int64_t chunk_size,
                             CausalAlignment alignment = CausalAlignment::top_left);
  /// Prefix-LM: bidirectional over the first `prefix_lengths[b]` keys, causal after.
  static Mask prefix_lm(at::Tensor prefix_lengths,
                        CausalAlignment alignment = CausalAlignment::top_left);
  /// Packed sequences: a query sees only keys of its own document.
  static Mask document(at::Tensor q_document_ids, at::Tensor kv_document_ids);
  /// Key padding: the first `kv_lengths[b]` keys of batch b are valid.
  static Mask key_padding(at::Tensor kv_lengths);
  /// An explicit block mask.
  static Mask block_mask(BlockMask block);
  /// An explicit boolean mask tensor (true keeps).
  static Mask from_tensor(at::Tensor keep);
};

/// How the terms of `AttentionSpec::masks` combine.
enum class MaskCombine : std::uint8_t {
  /// A key is visible when every term keeps it (and).
  all_of = 0,
  /// A key is visible when any term keeps it (or).
  any_of,
};

/// What `keel::attention` computes. Every field has a default: the default
/// spec is plain softmax attention with scale 1/sqrt(E).
struct AttentionSpec {
  /// Mask terms, combined by `combine`; empty means every key is visible.
  std::vector<Mask> masks;
  /// How `masks` combine.
  MaskCombine combine = MaskCombine::all_of;
  /// The score scale; a value <= 0 (the default) means 1/sqrt(E). Finite.
  double scale = 0.0;
  /// tanh soft-capping of the scaled scores; 0 (the default) is off. Finite, >= 0.
  double softcap = 0.0;
  /// Optional float `[Hq]` ALiBi slopes: adds `slopes[h] * (j - p)`, p the
  /// query position under `alibi_alignment`.
  at::Tensor alibi_slopes;
  /// Query positions for ALiBi.
  CausalAlignment alibi_alignment = CausalAlignment::top_left;
  /// Optional additive bias (or additive mask: -inf hides an entry),
  /// broadcastable to `[B, Hq, Lq, Lk]`, q's dtype; differentiable.
  at::Tensor bias;
  /// Also return the log-sum-exp of each row.
  bool return_lse = false;
  /// Which adapter serves the call.
  DispatchOptions dispatch;
};

/// The result of `keel::attention`.
struct AttentionOutput {
  /// `[B, Hq, Lq, Ev]`, q's dtype; rows that see no key are 0.
  at::Tensor out;
  /// `[B, Hq, Lq]`, natural log, float32 (float64 for float64 input), when
  /// `return_lse`; -inf on fully masked rows. Undefined otherwise.
  at::Tensor lse;
  /// Which adapter served the call, and why (the reason names the path:
  /// SDPA or keel's block-sparse kernel).
  DispatchInfo dispatch;
};

/// Computes `softmax(mask(modifiers(scale * q k^T))) v` per head.
///
/// `q` `[B, Hq, Lq, E]`, `k` `[B, Hkv, Lk, E]`, `v` `[B, Hkv, Lk, Ev]`:
/// defined, same dtype (float16, bfloat16, float32, float64) and device, with
/// `Hq % Hkv == 0` (query head h reads kv head `h / (Hq / Hkv)`). Errors:
/// `invalid_argument` naming the argument for bad input, `unsupported` when
/// the requested adapter cannot serve the call, `backend_error` when libtorch
/// fails.
KEEL_API result<AttentionOutput> attention(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const AttentionSpec& spec = {});

/// A paged key/value cache, as serving engines keep one: K and V live in a
/// pool of fixed-size pages, and each sequence lists the pages that hold its
/// keys, in order.
///
/// Key j of sequence b (0 <= j < `lengths[b]`) is row `j % page_size` of page
/// `page_table[b][j / page_size]`. Pages may be shared between sequences and
/// listed in any order; entries of a row past the pages its length needs are
/// never read (a table padded with any value is fine).
struct PagedKVCache {
  /// `[P, Hkv, page_size, E]`: the key pool, the query's dtype and device.
  at::Tensor k_pages;
  /// `[P, Hkv, page_size, Ev]`: the value pool, same P, Hkv and page_size.
  at::Tensor v_pages;
  /// Integer `[B, max_pages]`: each sequence's page ids, each page it reads
  /// in [0, P). On the CPU or the query's device (it is read on the host).
  at::Tensor page_table;
  /// Integer `[B]`: each sequence's number of keys, in [0, max_pages *
  /// page_size]. On the CPU or the query's device.
  at::Tensor lengths;
};

/// Attention of `q` `[B, Hq, Lq, E]` against a paged cache: for each
/// sequence b, the same result as `attention(q[b], K_b, V_b, spec)` on its
/// own `lengths[b]` keys laid out contiguously, so that bottom-right
/// alignment puts the last query at the sequence's last key.
///
/// Mask and bias tensors that index keys (document ids, a boolean mask,
/// `bias`) address key positions 0 .. `max_pages * page_size` - 1 and are
/// read over each sequence's first `lengths[b]`; a block mask is not
/// available on a paged cache. Pages are read where they lie (on the CPU,
/// row by row, or a cache-sized tile at a time; the sequence is never
/// gathered whole). This is
/// an inference call: it is `unsupported` when autograd would have to reach
/// q, the pages or `bias` (call it under `at::NoGradGuard` or with tensors
/// that do not require grad).
///
/// @snippet examples/snippets/header_snippets.cpp attention_paged
///
/// Errors: `invalid_argument` naming the field for a bad shape, dtype,
/// device, page id or length (never a read out of bounds), `unsupported` as
/// above or when the requested adapter has no paged path.
KEEL_API result<AttentionOutput> attention(const at::Tensor& q, const PagedKVCache& cache,
                                           const AttentionSpec& spec = {});

/// Queries of B sequences packed along one axis without padding, as
/// FlashAttention's varlen calls and FlashInfer's ragged batches take them
/// (a serving step mixing decodes, speculative tokens and prefill chunks):
/// sequence b's queries are rows `cu_seqlens_q[b]` .. `cu_seqlens_q[b+1]-1`.
struct PackedQueries {
  /// `[T, Hq, E]`: T queries in all.
  at::Tensor q;
  /// Integer `[B + 1]`, on the CPU: 0, non-decreasing offsets, ending at T.
  at::Tensor cu_seqlens_q;
};

/// Keys and values of B sequences packed the same way (training on
/// documents without padding): sequence b's keys are rows
/// `cu_seqlens_k[b]` .. `cu_seqlens_k[b+1]-1`.
struct PackedKeys {
  /// `[S, Hkv, E]`.
  at::Tensor k;
  /// `[S, Hkv, Ev]`.
  at::Tensor v;
  /// Integer `[B + 1]`, on the CPU: 0, non-decreasing offsets, ending at S.
  at::Tensor cu_seqlens_k;
};

/// Attention of packed ragged queries against a paged cache, in one call:
/// each sequence b is `attention(q_b, its cache row, spec)` with its own
/// queries `[1, Hq, Lq_b, E]` and `lengths[b]` keys, so bottom-right
/// alignment puts each sequence's last query at its own last key.
///
/// The result's `out` is `[T, Hq, Ev]` and `lse` `[T, Hq]`, row for row with
/// `q.q`. Masks keep their meaning per sequence; their per-sequence tensors
/// take a packed form: `prefix_lengths` and `kv_lengths` `[B]`,
/// `q_document_ids` `[T]` (per query), `kv_document_ids` `[B, max_pages *
/// page_size]`. Softcap and ALiBi apply as in a single call; `bias`, block
/// masks and boolean mask tensors have no packed form and are
/// `invalid_argument`. A sequence of 0 queries contributes no row; one of 0
/// keys gives rows of 0 with lse -inf. An inference call, as the paged one.
///
/// @snippet examples/snippets/header_snippets.cpp attention_packed
///
/// Errors: `invalid_argument` naming the field for bad offsets (not starting
/// at 0, decreasing, not ending at T, or a count that is not the table's
/// rows + 1) and for everything the paged call refuses, never a read out of
/// bounds.
KEEL_API result<AttentionOutput> attention(const PackedQueries& q, const PagedKVCache& cache,
                                           const AttentionSpec& spec = {});

/// Attention of packed ragged queries against packed keys and values (the
/// varlen layout): sequence b's queries attend to sequence b's keys only,
/// as `attention(q_b, k_b, v_b, spec)`. `out` `[T, Hq, Ev]`, `lse` `[T, Hq]`;
/// the per-sequence tensors of masks are as above but `kv_document_ids`,
/// which is packed `[S]` like the keys. Differentiable with respect to
/// `q.q`, `kv.k` and `kv.v` through autograd.
///
/// Errors: `invalid_argument` naming the field for bad offsets or a
/// sequence count that differs between queries and keys.
KEEL_API result<AttentionOutput> attention(const PackedQueries& q, const PackedKeys& kv,
                                           const AttentionSpec& spec = {});

}  // namespace v1
}  // namespace keel
