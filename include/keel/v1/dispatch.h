/// @file keel/v1/dispatch.h
/// @brief Choosing the adapter that serves a call, and learning which did.
///
/// Each keel operation is served by one of the adapters compiled into this
/// build: `compat` (keel's own implementations on long-stable ATen ops,
/// present in every build) or `native` (paths new in the libtorch release the
/// build was made against; present only when that release offers any).
/// Which one runs is chosen per call, first match wins:
///   1. the call's own `DispatchOptions::backend`, if not `Backend::unset`;
///   2. the `KEEL_BACKEND` environment variable (`auto`, `compat`, `native`),
///      so an operator can switch a native path off without a rebuild;
///   3. `keel::set_default_backend()`, for the whole process;
///   4. `Backend::automatic`.
///
/// `automatic` picks the native adapter when it can serve the whole call,
/// else compat. `native` on a build or a call native cannot serve is an
/// `Errc::unsupported` error with the reason, never a silent fallback; an
/// unknown `KEEL_BACKEND` value is an `Errc::invalid_argument` error that
/// lists the valid ones.
///
/// In one line:
/// `options.dispatch.backend = keel::Backend::native;`, and
/// `r.value().dispatch.adapter` names the adapter that served.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp dispatch_per_call
///
/// Setting `KEEL_LOG=dispatch` logs every decision (one line each, to
/// stderr).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "keel/v1/error.h"
#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {

/// Which adapter a call asks for.
enum class Backend : std::uint8_t {
  /// Not set here: defer to `KEEL_BACKEND`, then to the process default.
  unset = 0,
  /// Native when it serves the whole call, else compat.
  automatic,
  /// keel's compat adapter, present in every build.
  compat,
  /// The native adapter of the libtorch release built against.
  native,
};

/// The name used by `KEEL_BACKEND`: "unset", "auto", "compat" or "native".
KEEL_API std::string_view to_string(Backend backend) noexcept;

/// Parses "auto", "compat" or "native" (exactly; surrounding spaces are
/// ignored). Anything else is `Errc::invalid_argument` naming the valid values.
KEEL_API result<Backend> parse_backend(std::string_view text);

/// Sets the process-wide default, used when neither the call nor
/// `KEEL_BACKEND` chooses. `Backend::unset` restores `automatic`. Thread-safe.
KEEL_API void set_default_backend(Backend backend) noexcept;

/// The process-wide default set by `set_default_backend()`.
KEEL_API Backend default_backend() noexcept;

/// Per-call dispatch choices, carried by every operation's options.
struct DispatchOptions {
  /// The adapter this call asks for; `unset` defers to the environment.
  Backend backend = Backend::unset;
};

/// How keel's compat adapter ran an attention call
/// (`DispatchInfo::attention`).
enum class AttentionRoute : std::uint8_t {
  /// Not an attention call, or an adapter that does not say.
  none = 0,
  /// `at::scaled_dot_product_attention`: a dense call it computes exactly.
  dense,
  /// keel's block-sparse route: libtorch's CPU flash kernel once per range
  /// of visible key blocks, merged by log-sum-exp (or, off the CPU, its tile
  /// loop on ATen ops).
  block_sparse,
  /// keel's decode and chunked-prefill route (few queries against a cache):
  /// each kv head read once for its query group, only the visible keys.
  decode,
  /// A paged KV cache on the CPU: pages read where they lie.
  paged,
  /// A paged KV cache off the CPU: each sequence's pages gathered, then the
  /// contiguous route.
  gathered_paged,
};

/// "none", "dense", "block_sparse", "decode", "paged" or "gathered_paged".
KEEL_API std::string_view to_string(AttentionRoute route) noexcept;

/// What an attention call computed, as values (the same facts
/// `DispatchInfo::reason` puts in words).
struct AttentionDispatch {
  /// The route that ran.
  AttentionRoute route = AttentionRoute::none;
  /// Calls of libtorch's CPU flash kernel the block_sparse route made; -1
  /// when it ran its tile loop instead, and for every other route.
  std::int64_t flash_kernel_calls = -1;
  /// The fraction of the scores computed (block_sparse) or of the cache's
  /// keys read (decode, paged); 1 for dense.
  double visible_fraction = 1.0;
};

/// Which adapter served a call, and why.
struct DispatchInfo {
  /// The adapter's name: "compat" or "native".
  std::string adapter;
  /// The request that decided, after the rules above (never `unset`).
  Backend requested = Backend::automatic;
  /// Where the request came from: "call", "KEEL_BACKEND", "process default"
  /// or "built-in default".
  std::string requested_by;
  /// Why this adapter, in a sentence (e.g. why native was passed over).
  /// For people: code reads `served` and `attention`, never this text.
  std::string reason;
  /// The adapter that served: `Backend::compat` or `Backend::native` (the
  /// typed form of `adapter`). Since 0.6.0.
  Backend served = Backend::compat;
  /// How an attention call ran; `route` is `none` for other operations.
  /// Since 0.6.0.
  AttentionDispatch attention;
};

}  // namespace v1
}  // namespace keel
