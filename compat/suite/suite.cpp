#include "suite/suite.h"

#include <absl/strings/str_cat.h>

namespace keel::harness {

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

}  // namespace keel::harness
