// The OpenAI completions API of examples/serve: a request body checked
// field by field (a JSON parser that cannot overflow the stack, nesting
// and fields bounded), and the JSON bodies the server sends.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine.h"

namespace serve {

/// A request body, checked; `error` is empty when it can run.
struct Parsed {
  Params params;
  bool stream = false, include_usage = false;
  std::string error, param;
  int status = 400;
};

/// Parses `body` with arrays and objects nested at most `max_depth` deep
/// (the parser is iterative and stops at the first level past it), checks
/// every field against what this server implements, and tokenizes the
/// prompt with `engine`. Fields it does not implement are refused by name
/// unless they hold their neutral value; unknown fields are refused.
Parsed parse_completion(const std::string& body, int max_depth, const Engine& engine,
                        const std::string& model);

/// An error body as the OpenAI clients parse it (and vLLM sends it).
std::string error_body(int status, const std::string& message, const std::string& param = "");

/// `cmpl-` and 32 hex digits from the system's random source.
std::string completion_id();

/// The usage object of a final event.
nlohmann::json usage(const Event& e);

}  // namespace serve
