#include "comm/checked.h"

#include <map>
#include <thread>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <nlohmann/json.hpp>

#include "comm/validation.h"
#include "comm/waiting.h"
#include "guard.h"
#include "keel/v1/dtype.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

using internal::comm_detail::list_ranks;

namespace {

std::string describe(const Descriptor& d) {
  if (!d.pairwise) return d.call;
  return absl::StrCat(d.dtype, " rows of [", absl::StrJoin(d.trailing, ", "), "], sending [",
                      absl::StrJoin(d.input_splits, ", "), "], expecting [",
                      absl::StrJoin(d.output_splits, ", "), "]");
}

}  // namespace

std::string disagreement(const std::vector<std::optional<Descriptor>>& all, int size) {
  for (int r = 0; r < size; ++r) {
    if (!all[static_cast<std::size_t>(r)]) {
      return absl::StrCat("rank ", r, " posted something that is not a call description");
    }
  }
  const Descriptor& first = *all[0];
  if (!first.pairwise) {
    std::map<std::string, std::vector<int>> by_call;
    for (int r = 0; r < size; ++r) {
      const Descriptor& d = *all[static_cast<std::size_t>(r)];
      by_call[d.pairwise ? describe(d) : d.call].push_back(r);
    }
    if (by_call.size() == 1) return {};
    std::vector<std::string> parts;
    parts.reserve(by_call.size());
    for (const auto& [call, ranks] : by_call) {
      parts.push_back(
          absl::StrCat("rank", ranks.size() == 1 ? " " : "s ", list_ranks(ranks), ": ", call));
    }
    return absl::StrJoin(parts, "; ");
  }
  const auto n = static_cast<std::size_t>(size);
  for (int i = 0; i < size; ++i) {
    const Descriptor& d = *all[static_cast<std::size_t>(i)];
    if (!d.pairwise || d.dtype != first.dtype || d.trailing != first.trailing) {
      return absl::StrCat("rank 0: ", describe(first), "; rank ", i, ": ", describe(d));
    }
  }
  for (int i = 0; i < size; ++i) {
    const auto& in_i = all[static_cast<std::size_t>(i)]->input_splits;
    for (int j = 0; j < size; ++j) {
      const auto& out_j = all[static_cast<std::size_t>(j)]->output_splits;
      const auto sj = static_cast<std::size_t>(j);
      const auto si = static_cast<std::size_t>(i);
      if (in_i.size() != n || out_j.size() != n || in_i[sj] != out_j[si]) {
        return absl::StrCat("rank ", i, " sends ", in_i.size() > sj ? in_i[sj] : -1,
                            " rows to rank ", j, ", which expects ",
                            out_j.size() > si ? out_j[si] : -1);
      }
    }
  }
  return {};
}

Descriptor describe_tensor_call(const at::Tensor& t, const std::string& detail) {
  Descriptor d;
  d.call = absl::StrCat(keel::dtype_name(t), " ", internal::shape_text(t), detail);
  return d;
}

Descriptor pairwise(const at::Tensor& input, const std::vector<std::int64_t>& input_splits,
                    const std::vector<std::int64_t>& output_splits) {
  Descriptor d;
  d.pairwise = true;
  d.dtype = keel::dtype_name(input);
  auto sizes = input.sizes().vec();
  d.trailing.assign(sizes.begin() + 1, sizes.end());
  d.input_splits = input_splits;
  d.output_splits = output_splits;
  return d;
}

std::string encode(const Descriptor& d) {
  nlohmann::json j;
  j["call"] = d.call;
  j["pairwise"] = d.pairwise;
  j["dtype"] = d.dtype;
  j["trailing"] = d.trailing;
  j["input_splits"] = d.input_splits;
  j["output_splits"] = d.output_splits;
  return j.dump();
}

std::optional<Descriptor> decode(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto ints = [&](const char* key, std::vector<std::int64_t>& out) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return false;
    for (const auto& x : *it) {
      if (!x.is_number_integer()) return false;
      out.push_back(x.get<std::int64_t>());
    }
    return true;
  };
  Descriptor d;
  const auto call = j.find("call");
  const auto pair = j.find("pairwise");
  const auto dtype = j.find("dtype");
  if (call == j.end() || !call->is_string() || pair == j.end() || !pair->is_boolean() ||
      dtype == j.end() || !dtype->is_string()) {
    return std::nullopt;
  }
  d.call = call->get<std::string>();
  d.pairwise = pair->get<bool>();
  d.dtype = dtype->get<std::string>();
  if (!ints("trailing", d.trailing) || !ints("input_splits", d.input_splits) ||
      !ints("output_splits", d.output_splits)) {
    return std::nullopt;
  }
  return d;
}

result<void> check_metadata(GroupState& g, std::uint64_t seq, const std::string& what,
                            const Descriptor& mine, Clock::time_point deadline) {
  c10d::Store& store = *g.world->store;
  auto key = [&](std::uint64_t s, int r) { return absl::StrCat(g.prefix, "check/", s, "/", r); };
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(g.size));
  for (int r = 0; r < g.size; ++r) keys.push_back(key(seq, r));
  auto posted = internal::guarded(what, "checked mode", [&] {
    const std::string text = encode(mine);
    store.set(keys[g.rank], std::vector<std::uint8_t>(text.begin(), text.end()));
    return true;
  });
  if (!posted) return fail(g, seq, "failed", posted.error());
  auto pause = Millis(1);
  while (true) {
    auto all = internal::guarded(what, "checked mode", [&] { return store.check(keys); });
    if (!all) return fail(g, seq, "failed", all.error());
    if (all.value()) break;
    if (g.aborted.load()) return aborted_error(g, what);
    auto lost = g.world->liveness->lost(g.world_ranks);
    if (!lost.empty()) {
      return fail(
          g, seq, "peer_lost",
          Error(Errc::peer_lost, absl::StrCat("keel::comm: ", what, ": ", describe_lost(g, lost))));
    }
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < g.size; ++r) {
        auto there =
            internal::guarded(what, "checked mode", [&] { return store.check({keys[r]}); });
        if (!there || !there.value()) missing.push_back(r);
      }
      return fail(
          g, seq, "timed_out",
          Error(Errc::timeout,
                absl::StrCat("keel::comm: ", what, ": rank", missing.size() == 1 ? " " : "s ",
                             list_ranks(missing), " did not issue it in time (checked mode)")));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, Millis(20));
  }
  auto values = internal::guarded(what, "checked mode", [&] { return store.multiGet(keys); });
  if (!values) return fail(g, seq, "failed", values.error());
  if (seq > 1) {  // every rank posted seq, so all have read seq - 1
    (void)internal::guarded(what, "checked mode",
                            [&] { return store.deleteKey(key(seq - 1, g.rank)); });
  }
  std::vector<std::optional<Descriptor>> all_of;
  all_of.reserve(values.value().size());
  for (const auto& v : values.value()) all_of.push_back(decode(std::string(v.begin(), v.end())));
  const std::string mismatch = disagreement(all_of, g.size);
  if (mismatch.empty()) return success();
  // Every rank sees the same descriptors and returns the same error; the
  // operation is issued nowhere, so the group stays usable.
  g.recorder->finish(seq, "rejected", mismatch);
  return Error(
      Errc::invalid_argument,
      absl::StrCat("keel::comm: ", what, ": the ranks disagree (checked mode): ", mismatch));
}

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
