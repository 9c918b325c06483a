#include "api.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <random>
#include <utility>

namespace serve {

using nlohmann::json;

namespace {

struct TooDeep {};

// nlohmann's parser keeps its nesting on the heap (a SAX state vector), so
// no input overflows the stack; the callback stops it one level past the
// limit, before the rest of the body is read.
bool parse_bounded(const std::string& body, int max_depth, json* out, std::string* why) {
  try {
    *out = json::parse(body, [max_depth](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth >= max_depth) {
        throw TooDeep{};
      }
      return true;
    });
    return true;
  } catch (const TooDeep&) {
    *why = "the body nests arrays or objects deeper than " + std::to_string(max_depth);
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..."
    std::string what = e.what();
    const std::size_t at = what.find("] ");
    *why = "the body is not valid JSON: " + (at == std::string::npos ? what : what.substr(at + 2));
  }
  return false;
}

// Fields of OpenAI's APIs that this server does not implement, with the
// value that means "off": present with any other value, refused.
const std::map<std::string, json>& neutral_fields(Api api) {
  static const std::map<std::string, json> completions = {{"best_of", 1},
                                                          {"echo", false},
                                                          {"frequency_penalty", 0},
                                                          {"logit_bias", json::object()},
                                                          {"logprobs", nullptr},
                                                          {"presence_penalty", 0},
                                                          {"suffix", nullptr},
                                                          {"top_k", -1},
                                                          {"n", 1},
                                                          {"user", nullptr}};
  static const std::map<std::string, json> chat = {{"frequency_penalty", 0},
                                                   {"logit_bias", json::object()},
                                                   {"logprobs", false},
                                                   {"top_logprobs", nullptr},
                                                   {"presence_penalty", 0},
                                                   {"top_k", -1},
                                                   {"n", 1},
                                                   {"user", nullptr},
                                                   {"tools", nullptr},
                                                   {"tool_choice", "none"},
                                                   {"response_format", json{{"type", "text"}}},
                                                   {"parallel_tool_calls", nullptr}};
  return api == Api::chat ? chat : completions;
}

// A chat's messages: roles the template knows, text content (a string or
// text parts).
bool read_messages(const json& j, std::vector<models::ChatMessage>* out, std::string* why) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    *why = "messages is required: a non-empty list of {role, content}";
    return false;
  }
  for (const json& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      *why = "messages: each message is an object with a string role";
      return false;
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant") {
      *why = "messages: role '" + role + "' is not supported (system, user or assistant)";
      return false;
    }
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content" && key != "name") {
        *why = "messages: field '" + key + "' is not supported";
        return false;
      }
    }
    std::string content;
    const json c = m.value("content", json());
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          *why = R"(messages: content parts must be {"type": "text", "text": ...})";
          return false;
        }
        content += part["text"].get<std::string>();
      }
    } else {
      *why = "messages: content must be a string or a list of text parts";
      return false;
    }
    out->push_back({role, std::move(content)});
  }
  return true;
}

bool is_neutral(const json& value, const json& neutral) {
  if (value.is_null()) return true;
  if (neutral.is_number() && value.is_number()) return value.get<double>() == neutral.get<double>();
  return value == neutral;
}

}  // namespace

std::string error_body(int status, const std::string& message, const std::string& param) {
  const char* type = status == 404   ? "NotFoundError"
                     : status == 413 ? "RequestTooLargeError"
                     : status == 415 ? "UnsupportedMediaTypeError"
                     : status == 503 ? "ServiceUnavailableError"
                     : status >= 500 ? "InternalServerError"
                                     : "BadRequestError";
  json e = {{"message", message}, {"type", type}, {"code", status}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string completion_id(Api api) {
  std::random_device device;
  std::string id = api == Api::chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 4; ++i) {
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(device()));
    id += hex;
  }
  return id;
}

json usage(const Event& e) {
  return {{"prompt_tokens", e.prompt_tokens},
          {"completion_tokens", e.completion_tokens},
          {"total_tokens", e.prompt_tokens + e.completion_tokens}};
}

Parsed parse_request(Api api, const std::string& body, int max_depth, const Engine& engine,
                     const std::string& model) {
  Parsed out;
  out.api = api;
  auto fail = [&](std::string param, std::string message, int status = 400) {
    out.param = std::move(param);
    out.error = std::move(message);
    out.status = status;
    return out;
  };
  json j;
  std::string why;
  if (!parse_bounded(body, max_depth, &j, &why)) return fail("", why);
  if (!j.is_object()) return fail("", "the body must be a JSON object");
  static const char* const implemented[] = {"model",  "max_tokens",     "temperature",
                                            "top_p",  "seed",           "stop",
                                            "stream", "stream_options", "ignore_eos"};
  const char* const own = api == Api::chat ? "messages" : "prompt";
  const std::map<std::string, json>& neutral_values = neutral_fields(api);
  for (const auto& [key, value] : j.items()) {
    if (key == own || (api == Api::chat && key == "max_completion_tokens") ||
        std::find(std::begin(implemented), std::end(implemented), key) != std::end(implemented)) {
      continue;
    }
    auto neutral = neutral_values.find(key);
    if (neutral == neutral_values.end()) {
      return fail(key, "unknown field '" + key + "'");
    }
    if (key != "user" && !is_neutral(value, neutral->second)) {
      return fail(key, key + " is not supported by this server (only " + neutral->second.dump() +
                           " or null)");
    }
  }
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string()) {
    return fail("user", "user must be a string");
  }
  if (!j.contains("model") || !j["model"].is_string()) {
    return fail("model", "model is required and must be a string");
  }
  if (j["model"] != model) {
    return fail("model",
                "the model '" + j["model"].get<std::string>() +
                    "' does not exist; this server serves '" + model + "'",
                404);
  }
  if (api == Api::chat) {
    // max_completion_tokens is the chat API's newer name for max_tokens.
    if (j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()) {
      if (j.contains("max_tokens") && !j["max_tokens"].is_null()) {
        return fail("max_completion_tokens", "give max_tokens or max_completion_tokens, not both");
      }
      j["max_tokens"] = j["max_completion_tokens"];
    }
    if (!engine.model().chat) {
      return fail("messages", "this model has no chat template; use /v1/completions");
    }
    std::vector<models::ChatMessage> messages;
    if (!read_messages(j, &messages, &why)) return fail("messages", why);
    j["prompt"] = engine.model().chat->render(messages, /*add_generation_prompt=*/true);
  }
  // prompt: a string, one string in a list, token ids, or one list of them.
  if (!j.contains("prompt")) return fail("prompt", "prompt is required");
  json prompt = j["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    prompt = prompt[0];
  }
  const std::string ids_rule =
      "prompt: token ids must be integers in [0, " + std::to_string(engine.vocabulary()) + ")";
  if (prompt.is_string()) {
    out.params.prompt = engine.encode(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) {
    for (const json& id : prompt) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() >= engine.vocabulary()) {
        return fail("prompt", ids_rule);
      }
      out.params.prompt.push_back(id.get<std::int64_t>());
    }
  } else if (prompt.is_array() && prompt.size() > 1 && prompt[0].is_string()) {
    return fail("prompt", "prompt: one prompt per request (n = 1)");
  } else if (prompt.is_array() && !prompt.empty()) {
    return fail("prompt", ids_rule);
  } else if (!prompt.is_array()) {
    return fail("prompt", "prompt must be a string, a list of token ids, or a list of one of them");
  }
  if (out.params.prompt.empty()) {
    return fail(own, std::string(own) + " must not be empty (or only bytes without a token)");
  }
  auto number = [&](const char* field, double lo, double hi, double* value) {
    if (!j.contains(field) || j[field].is_null()) return true;
    if (!j[field].is_number() || j[field].get<double>() < lo || j[field].get<double>() > hi) {
      return false;
    }
    *value = j[field].get<double>();
    return true;
  };
  double max_tokens = 16, temperature = 1, top_p = 1, seed = -1;
  const std::int64_t limit = engine.options().max_model_len;
  if (j.contains("max_tokens") && !j["max_tokens"].is_null() &&
      !j["max_tokens"].is_number_integer()) {
    return fail("max_tokens", "max_tokens must be an integer");
  }
  if (!number("max_tokens", 0, 1e15, &max_tokens))
    return fail("max_tokens", "max_tokens must be >= 0");
  if (!number("temperature", 0, 2, &temperature))
    return fail("temperature", "temperature must be in [0, 2]");
  if (!number("top_p", 0, 1, &top_p) || top_p <= 0) return fail("top_p", "top_p must be in (0, 1]");
  if (j.contains("seed") && !j["seed"].is_null() &&
      (!j["seed"].is_number_integer() || !number("seed", 0, 9.007199254740992e15, &seed))) {
    return fail("seed", "seed must be an integer in [0, 2^53]");
  }
  out.params.max_tokens = static_cast<std::int64_t>(max_tokens);
  out.params.temperature = temperature;
  out.params.top_p = top_p;
  if (seed >= 0) out.params.seed = static_cast<std::uint64_t>(seed);
  const auto prompt_tokens = static_cast<std::int64_t>(out.params.prompt.size());
  if (prompt_tokens >= limit) {
    return fail(own, "The prompt has " + std::to_string(prompt_tokens) +
                         " tokens; the model's context length is only " + std::to_string(limit) +
                         " tokens.");
  }
  if (prompt_tokens + out.params.max_tokens > limit) {
    // vLLM's wording: the request can never fit, whatever the load.
    return fail("max_tokens", "You passed " + std::to_string(prompt_tokens) +
                                  " input tokens and requested " +
                                  std::to_string(out.params.max_tokens) +
                                  " output tokens. However, the model's context length is only " +
                                  std::to_string(limit) + " tokens.");
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    json stop = j["stop"].is_string() ? json::array({j["stop"]}) : j["stop"];
    if (!stop.is_array() || stop.size() > 4)
      return fail("stop", "stop must be a string or up to 4 strings");
    for (const json& s : stop) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        return fail("stop", "stop strings must be non-empty strings");
      }
      out.params.stop.push_back(s.get<std::string>());
    }
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) {
    if (!j["ignore_eos"].is_boolean()) return fail("ignore_eos", "ignore_eos must be a boolean");
    out.params.ignore_eos = j["ignore_eos"].get<bool>();
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return fail("stream", "stream must be a boolean");
    out.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!out.stream) return fail("stream_options", "stream_options is only allowed with stream");
    const json& so = j["stream_options"];
    if (!so.is_object()) return fail("stream_options", "stream_options must be an object");
    for (const auto& [key, value] : so.items()) {
      if (key != "include_usage") return fail("stream_options", "unknown field '" + key + "'");
      if (!value.is_boolean()) {
        return fail("stream_options", "stream_options.include_usage must be a boolean");
      }
      out.include_usage = value.get<bool>();
    }
  }
  return out;
}

}  // namespace serve
