#include "harness/suite.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

namespace keel::harness {

Tolerance tolerance_for(const std::string& dtype) {
  // float32 and the half types accumulate in float32 in every keel
  // operation, so their outputs differ across releases only by summation
  // order; the half types' inputs are exact in the file.
  if (dtype == "float64") return {1e-10, 1e-10};
  if (dtype == "float32") return {1e-5, 1e-5};
  if (dtype == "bfloat16") return {1e-2, 1.6e-2};
  if (dtype == "float16") return {1e-3, 1e-3};
  return {0, 0};
}

result<Run> Family::run_rank(comm::Communicator& /*group*/, const Case& c,
                             Backend /*backend*/) const {
  return Error(Errc::corrupt_data, absl::StrCat("case ", c.id, ": the ", operation(),
                                                " family has no cases that run on ranks"));
}

const std::vector<std::unique_ptr<Family>>& families() {
  static const auto* const all = [] {
    auto* v = new std::vector<std::unique_ptr<Family>>;
    v->push_back(make_logsumexp_family());
    v->push_back(make_attention_family());
    v->push_back(make_loss_family());
    v->push_back(make_comm_family());
    return v;
  }();
  return *all;
}

const Family* find_family(const std::string& operation) {
  for (const auto& f : families()) {
    if (f->operation() == operation) return f.get();
  }
  return nullptr;
}

bool matches_filter(const std::string& id, const std::string& filter) {
  if (filter.empty()) return true;
  for (absl::string_view part : absl::StrSplit(filter, ',', absl::SkipEmpty())) {
    if (id.find(part.data(), 0, part.size()) != std::string::npos) return true;
  }
  return false;
}

}  // namespace keel::harness
