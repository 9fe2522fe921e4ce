// runtime/server/api.cc
#include "runtime/server/api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace tierkv::server {
namespace {

using nlohmann::json;

Status Bad(const std::string& m) { return Status::InvalidArgument(m); }

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

// 'field' in quotes. (Appended: GCC 12 warns, falsely, that "'" + std::string(...)
// may overlap in its memcpy, -Wrestrict.)
std::string Quoted(std::string_view field) {
  std::string q = "'";
  q.append(field).append("'");
  return q;
}

Status WrongType(std::string_view field, const json& v, std::string_view want) {
  return Bad(Quoted(field) + " must be " + std::string(want) + ", not " + TypeName(v));
}

// The optional fields of a body, each read once with its type and range checked.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  const json* Get(std::string_view name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status Bool(std::string_view name, bool* out) const {
    const json* v = Get(name);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return WrongType(name, *v, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }

  Status Int(std::string_view name, int64_t lo, int64_t hi, int* out) const {
    const json* v = Get(name);
    if (v == nullptr) return Status::Ok();
    int64_t x = 0;
    if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                          : static_cast<int64_t>(u);
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
               std::fabs(v->get<double>()) < 9e15) {
      x = static_cast<int64_t>(v->get<double>());
    } else {
      return WrongType(name, *v, "an integer");
    }
    if (x < lo || x > hi) {
      return Bad(Quoted(name) + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", not " +
                 std::to_string(x));
    }
    *out = static_cast<int>(x);
    return Status::Ok();
  }

  Status Float(std::string_view name, double lo, double hi, float* out) const {
    const json* v = Get(name);
    if (v == nullptr) return Status::Ok();
    if (!v->is_number()) return WrongType(name, *v, "a number");
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "'%.*s' must be in %g..%g, not %g", static_cast<int>(name.size()), name.data(), lo,
                    hi, x);
      return Bad(buf);
    }
    *out = static_cast<float>(x);
    return Status::Ok();
  }

 private:
  const json& body_;
};

// The message's text: a string, or an array of {"type": "text", "text": ...} parts.
Result<std::string> MessageText(const json& content, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return WrongType(where, content, "a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return WrongType(at, part, "an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return Bad(at + ".type must be a string");
    if (*type != "text") {
      return Status::Unsupported(at + ": content of type '" + type->get<std::string>() + "' (this server reads text only)");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return Bad(at + ".text must be a string");
    text += t->get<std::string>();
  }
  return text;
}

Result<std::vector<ChatMessage>> ParseMessages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end()) return Bad("'messages' is required");
  if (!it->is_array()) return WrongType("messages", *it, "an array");
  if (it->empty()) return Bad("'messages' must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(at, m, "an object");
    for (auto f = m.begin(); f != m.end(); ++f) {
      static const std::string_view kKnown[] = {"role", "content", "name", "reasoning_content"};
      if (std::find(std::begin(kKnown), std::end(kKnown), f.key()) == std::end(kKnown)) {
        return Bad(at + ": unknown field '" + f.key() + "'");
      }
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Bad(at + ".role must be a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for it
    if (r != "system" && r != "user" && r != "assistant") {
      return Bad(at + ".role '" + role->get<std::string>() + "': must be system, developer, user or assistant");
    }
    auto content = m.find("content");
    if (content == m.end()) return Bad(at + ".content is required");
    if (content->is_null() && r != "assistant") return Bad(at + ".content must not be null");
    TIERKV_ASSIGN_OR_RETURN(std::string text, MessageText(*content, i));
    out.push_back(ChatMessage{std::move(r), std::move(text)});
  }
  return out;
}

Status ParsePrompt(const json& body, GenerationRequest* r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Bad("'prompt' is required");
  const json& p = *it;
  if (p.is_string()) {
    r->prompt = p.get<std::string>();
    return Status::Ok();
  }
  if (!p.is_array()) return WrongType("prompt", p, "a string or an array of token ids");
  if (p.size() == 1 && p[0].is_string()) {  // OpenAI's batch of one prompt
    r->prompt = p[0].get<std::string>();
    return Status::Ok();
  }
  if (p.empty()) return Bad("'prompt' must not be empty");
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].is_string()) return Status::Unsupported("'prompt': several prompts in one request (send one each)");
    if (!p[i].is_number_integer() && !p[i].is_number_unsigned()) {
      return WrongType("prompt[" + std::to_string(i) + "]", p[i], "a token id");
    }
    const int64_t id = p[i].get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max() || (p[i].is_number_unsigned() && id < 0)) {
      return Bad("prompt[" + std::to_string(i) + "]: token id " + p[i].dump() + " is out of range");
    }
    r->prompt_tokens.push_back(static_cast<int32_t>(id));
  }
  return Status::Ok();
}

Status ParseStop(const json* v, std::vector<std::string>* out) {
  if (v == nullptr) return Status::Ok();
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) return WrongType("stop[" + std::to_string(i) + "]", (*v)[i], "a string");
      stops.push_back((*v)[i].get<std::string>());
    }
  } else {
    return WrongType("stop", *v, "a string or an array of strings");
  }
  if (stops.size() > kMaxStops) return Bad("'stop': at most " + std::to_string(kMaxStops) + " strings");
  for (const std::string& s : stops) {
    if (s.size() > kMaxStopBytes) return Bad("'stop': a string of at most " + std::to_string(kMaxStopBytes) + " bytes");
    if (!s.empty()) out->push_back(s);
  }
  return Status::Ok();
}

// JSON nesting depth of `body` (brackets outside strings), stopping past `limit`.
int JsonDepth(std::string_view body, int limit) {
  int depth = 0, most = 0;
  bool in_string = false, escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
      if (most > limit) return most;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}

}  // namespace

Result<nlohmann::json> ParseObject(std::string_view body) {
  if (JsonDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return Bad("the body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("the body is not valid JSON");
  if (!j.is_object()) return Bad("the body must be a JSON object, not " + std::string(TypeName(j)));
  return j;
}

Status CheckKnownFields(const nlohmann::json& body, std::initializer_list<std::string_view> known) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      return Bad("unknown field '" + it.key() + "'");
    }
  }
  return Status::Ok();
}

Result<GenerationRequest> ParseGenerationRequest(Endpoint endpoint, std::string_view text) {
  TIERKV_ASSIGN_OR_RETURN(const json body, ParseObject(text));
  GenerationRequest r;
  r.endpoint = endpoint;
  // Known everywhere: sampling, llama.cpp's extensions, and what OpenAI clients send
  // that changes nothing here.
  static const std::initializer_list<std::string_view> kChat = {
      "model", "messages", "max_tokens", "max_completion_tokens", "n_predict", "temperature", "top_p", "top_k",
      "min_p", "repeat_penalty", "repeat_last_n", "frequency_penalty", "presence_penalty", "seed", "stop", "stream",
      "stream_options", "n", "cache_prompt", "id_slot", "n_keep", "return_progress", "ignore_eos", "user",
      "metadata", "store", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
      "parallel_tool_calls", "logit_bias", "chat_template_kwargs", "reasoning_format", "reasoning_effort",
      "service_tier", "timings_per_token"};
  static const std::initializer_list<std::string_view> kCompletions = {
      "model", "prompt", "max_tokens", "n_predict", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
      "repeat_last_n", "frequency_penalty", "presence_penalty", "seed", "stop", "stream", "stream_options", "n",
      "cache_prompt", "id_slot", "n_keep", "return_progress", "ignore_eos", "user", "logprobs", "echo", "best_of",
      "suffix", "logit_bias", "n_probs", "timings_per_token", "samplers"};
  TIERKV_RETURN_IF_ERROR(CheckKnownFields(body, endpoint == Endpoint::kChat ? kChat : kCompletions));
  const Fields f(body);
  if (const json* m = f.Get("model"); m != nullptr) {
    if (!m->is_string()) return WrongType("model", *m, "a string");
    r.model = m->get<std::string>();
  }
  if (endpoint == Endpoint::kChat) {
    TIERKV_ASSIGN_OR_RETURN(r.messages, ParseMessages(body));
  } else {
    TIERKV_RETURN_IF_ERROR(ParsePrompt(body, &r));
  }
  // Length: -1 (until the end), or a count; the first of these given.
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  for (const char* name : {"max_completion_tokens", "max_tokens", "n_predict"}) {
    if (f.Get(name) != nullptr) {
      TIERKV_RETURN_IF_ERROR(f.Int(name, -1, kMaxInt, &r.n_predict));
      break;
    }
  }
  // llama.cpp's server defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).
  r.sampler.temperature = 0.8f;
  SamplerOptions& s = r.sampler;
  TIERKV_RETURN_IF_ERROR(f.Float("temperature", 0, 100, &s.temperature));
  TIERKV_RETURN_IF_ERROR(f.Float("top_p", 0, 1, &s.top_p));
  TIERKV_RETURN_IF_ERROR(f.Int("top_k", -1, kMaxInt, &s.top_k));
  TIERKV_RETURN_IF_ERROR(f.Float("min_p", 0, 1, &s.min_p));
  TIERKV_RETURN_IF_ERROR(f.Float("repeat_penalty", 1e-6, 100, &s.repeat_penalty));
  TIERKV_RETURN_IF_ERROR(f.Int("repeat_last_n", -1, kMaxInt, &s.repeat_last_n));
  TIERKV_RETURN_IF_ERROR(f.Float("frequency_penalty", -2, 2, &s.frequency_penalty));
  TIERKV_RETURN_IF_ERROR(f.Float("presence_penalty", -2, 2, &s.presence_penalty));
  if (const json* seed = f.Get("seed"); seed != nullptr) {
    // -1 (llama.cpp's "random") or a seed.
    if (seed->is_number_integer() && seed->get<int64_t>() == -1) {
      // left to the default below
    } else if (seed->is_number_unsigned() || (seed->is_number_integer() && seed->get<int64_t>() >= 0)) {
      s.seed = seed->get<uint64_t>();
      r.seed_given = true;
    } else {
      return WrongType("seed", *seed, "an integer >= -1");
    }
  }
  if (!r.seed_given) s.seed = static_cast<uint32_t>(std::random_device{}());
  TIERKV_RETURN_IF_ERROR(ParseStop(f.Get("stop"), &r.stop));
  TIERKV_RETURN_IF_ERROR(f.Bool("stream", &r.stream));
  if (const json* so = f.Get("stream_options"); so != nullptr) {
    if (!so->is_object()) return WrongType("stream_options", *so, "an object");
    TIERKV_RETURN_IF_ERROR(CheckKnownFields(*so, {"include_usage", "continuous_usage_stats"}).Annotate("stream_options"));
    TIERKV_RETURN_IF_ERROR(Fields(*so).Bool("include_usage", &r.include_usage).Annotate("stream_options"));
  }
  int n = 1;
  TIERKV_RETURN_IF_ERROR(f.Int("n", 1, kMaxInt, &n));
  if (n != 1) return Status::Unsupported("'n': one choice per request (n = 1)");
  int best_of = 1;
  TIERKV_RETURN_IF_ERROR(f.Int("best_of", 1, kMaxInt, &best_of));
  if (best_of != 1) return Status::Unsupported("'best_of': one choice per request (best_of = 1)");
  TIERKV_RETURN_IF_ERROR(f.Bool("cache_prompt", &r.cache_prompt));
  TIERKV_RETURN_IF_ERROR(f.Int("id_slot", -1, kMaxInt, &r.id_slot));
  TIERKV_RETURN_IF_ERROR(f.Int("n_keep", -1, kMaxInt, &r.n_keep));
  TIERKV_RETURN_IF_ERROR(f.Bool("return_progress", &r.return_progress));
  TIERKV_RETURN_IF_ERROR(f.Bool("ignore_eos", &r.ignore_eos));
  // What is known but not done here: refused when it would change the reply.
  if (const json* v = f.Get("user"); v != nullptr && !v->is_string()) return WrongType("user", *v, "a string");
  if (const json* v = f.Get("logprobs"); v != nullptr) {
    if (!(v->is_boolean() || v->is_number_integer())) return WrongType("logprobs", *v, "a boolean or an integer");
    if ((v->is_boolean() && v->get<bool>()) || (v->is_number_integer() && v->get<int64_t>() != 0)) {
      return Status::Unsupported("'logprobs': token log-probabilities are not reported by this server");
    }
  }
  if (const json* v = f.Get("n_probs"); v != nullptr) {
    if (!v->is_number_integer()) return WrongType("n_probs", *v, "an integer");
    if (v->get<int64_t>() != 0) return Status::Unsupported("'n_probs': token probabilities are not reported");
  }
  if (const json* v = f.Get("echo"); v != nullptr) {
    if (!v->is_boolean()) return WrongType("echo", *v, "true or false");
    if (v->get<bool>()) return Status::Unsupported("'echo': the prompt is not echoed");
  }
  if (const json* v = f.Get("suffix"); v != nullptr) {
    if (!v->is_string()) return WrongType("suffix", *v, "a string");
    if (!v->get<std::string>().empty()) return Status::Unsupported("'suffix': fill-in-the-middle is not supported");
  }
  if (const json* v = f.Get("tools"); v != nullptr) {
    if (!v->is_array()) return WrongType("tools", *v, "an array");
    if (!v->empty()) return Status::Unsupported("'tools': tool calls are not supported by this server");
  }
  if (const json* v = f.Get("tool_choice"); v != nullptr) {
    if (!(v->is_string() && (*v == "none" || *v == "auto"))) {
      return Status::Unsupported("'tool_choice': tool calls are not supported by this server");
    }
  }
  if (const json* v = f.Get("logit_bias"); v != nullptr) {
    if (!v->is_object() && !v->is_array()) return WrongType("logit_bias", *v, "an object");
    if (!v->empty()) return Status::Unsupported("'logit_bias' is not supported by this server");
  }
  if (const json* v = f.Get("response_format"); v != nullptr) {
    if (!v->is_object()) return WrongType("response_format", *v, "an object");
    auto type = v->find("type");
    if (type == v->end() || *type != "text") {
      return Status::Unsupported("'response_format': only {\"type\": \"text\"} (no JSON or schema constraints)");
    }
  }
  for (const char* name : {"metadata", "chat_template_kwargs"}) {
    if (const json* v = f.Get(name); v != nullptr && !v->is_object()) return WrongType(name, *v, "an object");
  }
  for (const char* name : {"store", "parallel_tool_calls", "timings_per_token"}) {
    if (const json* v = f.Get(name); v != nullptr && !v->is_boolean()) return WrongType(name, *v, "true or false");
  }
  for (const char* name : {"reasoning_format", "reasoning_effort", "service_tier"}) {
    if (const json* v = f.Get(name); v != nullptr && !v->is_string()) return WrongType(name, *v, "a string");
  }
  if (const json* v = f.Get("top_logprobs"); v != nullptr && !v->is_number_integer()) {
    return WrongType("top_logprobs", *v, "an integer");
  }
  if (const json* v = f.Get("samplers"); v != nullptr && !v->is_array()) return WrongType("samplers", *v, "an array");
  TIERKV_RETURN_IF_ERROR(r.sampler.Validate());
  return r;
}

int HttpStatusFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnsupported: return 400;
    case StatusCode::kPermissionDenied: return 401;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kExhausted: return 503;
    default: return 500;
  }
}

nlohmann::json ErrorBody(int http_status, std::string_view message) {
  const char* type = "server_error";
  switch (http_status) {
    case 400: case 413: case 409: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 404: type = "not_found_error"; break;
    case 503: type = "unavailable_error"; break;
    default: if (http_status >= 400 && http_status < 500) type = "invalid_request_error"; break;
  }
  return {{"error", {{"code", http_status}, {"message", std::string(message)}, {"type", type}}}};
}

std::string DumpJson(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  static const std::pair<std::string_view, std::string_view> kBreaks[] = {
      {"\xC2\x85", "\\u0085"}, {"\xE2\x80\xA8", "\\u2028"}, {"\xE2\x80\xA9", "\\u2029"}};
  for (const auto& [raw, escaped] : kBreaks) {
    for (size_t at = s.find(raw); at != std::string::npos; at = s.find(raw, at + escaped.size())) {
      s.replace(at, raw.size(), escaped);
    }
  }
  return s;
}

size_t CompleteUtf8Prefix(std::string_view text) {
  // Look back at most 3 bytes for the lead byte of a sequence that is not complete.
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    size_t len = 1;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
    }
    return len > back ? n - back : n;
  }
  return n;
}

size_t FindStop(std::string_view text, const std::vector<std::string>& stops, std::string* which) {
  size_t best = std::string_view::npos;
  for (const std::string& s : stops) {
    const size_t at = text.find(s);
    if (at < best) {
      best = at;
      if (which != nullptr) *which = s;
    }
  }
  return best;
}

size_t PartialStopSuffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& s : stops) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > held; --k) {
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        held = k;
        break;
      }
    }
  }
  return held;
}

Status CheckSessionFileName(std::string_view name) {
  if (name.empty()) return Bad("'filename' must not be empty");
  if (name.size() > 200) return Bad("'filename' must be at most 200 bytes");
  if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos ||
      name.find('\\') != std::string_view::npos) {
    return Bad("'filename' must be a plain file name in the session directory (no '/')");
  }
  if (name.front() == '.') return Bad("'filename' must not start with '.'");
  return Status::Ok();
}

}  // namespace tierkv::server
