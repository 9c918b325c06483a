// The OpenAI completions and chat completions APIs of examples/serve: a
// request body checked field by field (a JSON parser that cannot overflow
// the stack, nesting and fields bounded), and the JSON bodies the server
// sends.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine.h"

namespace serve {

/// Which API a body is for.
enum class Api { completions, chat };

/// A request body, checked; `error` is empty when it can run.
struct Parsed {
  Api api = Api::completions;
  Params params;
  bool stream = false, include_usage = false;
  std::string error, param;
  int status = 400;
};

/// Parses `body` with arrays and objects nested at most `max_depth` deep
/// (the parser is iterative and stops at the first level past it), checks
/// every field against what this server implements, and tokenizes the
/// prompt (for chat, the messages rendered with the model's chat template)
/// with `engine`. Fields it does not implement are refused by name unless
/// they hold their neutral value; unknown fields are refused.
Parsed parse_request(Api api, const std::string& body, int max_depth, const Engine& engine,
                     const std::string& model);

/// An error body as the OpenAI clients parse it (and vLLM sends it).
std::string error_body(int status, const std::string& message, const std::string& param = "");

/// `cmpl-` (`chatcmpl-` for chat) and 32 hex digits from the system's
/// random source.
std::string completion_id(Api api);

/// The usage object of a final event.
nlohmann::json usage(const Event& e);

}  // namespace serve
