#include "suite/record_compare.h"

#include <absl/strings/str_cat.h>

#include "engine/golden.h"
#include "suite/suite.h"

namespace keel::harness {

result<std::size_t> record(const RecordOptions& options) {
  std::vector<Case> selected;
  for (const auto& family : families()) {
    for (Case& c : family->make_cases()) {
      if (matches_filter(c.id, options.filter)) selected.push_back(std::move(c));
    }
  }
  if (selected.empty()) {
    return Error(Errc::invalid_argument,
                 absl::StrCat("record: --filter '", options.filter, "' selects no case"));
  }
  std::vector<Recorded> recorded;
  for (std::size_t i = 0; i < selected.size(); ++i) {
    Case& c = selected[i];
    if (options.progress) options.progress(i, selected.size(), c.id);
    result<Run> run = find_family(c.operation)->run(c, options.backend);
    if (!run) {
      return Error(run.error().code(),
                   absl::StrCat("record: case ", c.id, ": ", run.error().message()));
    }
    recorded.push_back({std::move(c), std::move(run).value()});
  }
  if (options.progress) options.progress(selected.size(), selected.size(), "");
  const Backend backend = options.backend == Backend::unset ? Backend::automatic : options.backend;
  result<void> written = write_golden(options.out, recorded, std::string(to_string(backend)));
  if (!written) return written.error();
  return selected.size();
}

result<Report> compare(const CompareOptions& options) {
  return compare_golden(options, [&](const std::string& operation) -> Runner {
    const Family* family = find_family(operation);
    if (family == nullptr) return {};
    return [family, &options](const Case& c) { return family->run(c, options.backend); };
  });
}

}  // namespace keel::harness
