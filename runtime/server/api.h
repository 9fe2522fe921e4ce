// runtime/server/api.h
//
// The HTTP API's requests and replies as data, apart from sockets and the model
// (docs/server.md): the body of a generation request (OpenAI's /v1/chat/completions and
// /v1/completions, llama.cpp's /completion) parsed and checked into a GenerationRequest,
// the other endpoints' bodies, and the error bodies. Every malformed body is a Status
// (kInvalidArgument = 400, ...) whose message names the field; nothing here throws.
//
// Unknown fields are refused (400 naming the field) rather than ignored, so that a
// parameter a client relies on is never silently dropped; fields OpenAI clients send
// that change nothing here (user, metadata, store, ...) are known and ignored, and
// features tierkv does not have (n > 1, tools, logprobs) are refused when asked for.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory/status.h"
#include "runtime/chat_template.h"
#include "runtime/sampler.h"

namespace tierkv::server {

enum class Endpoint { kChat, kCompletions, kLlamaCompletion };

// A body's nesting deeper than this is refused before it is parsed.
inline constexpr int kMaxJsonDepth = 64;
// At most this many stop strings, each at most kMaxStopBytes.
inline constexpr size_t kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 256;

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                     // as given ("" = none); replies name the server's model
  std::vector<ChatMessage> messages;     // kChat
  std::optional<std::string> prompt;     // completions: text (special tokens parsed, BOS added)
  std::vector<int32_t> prompt_tokens;    // completions: token ids given instead
  int n_predict = -1;                    // -1: until end of generation or the end of the context
  SamplerOptions sampler;                // temperature etc. (llama.cpp's server defaults: temperature 0.8)
  bool seed_given = false;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool cache_prompt = true;
  int n_keep = 0;                        // accepted (llama.cpp's), no context shift here
  int id_slot = -1;                      // -1: the server picks
  bool return_progress = false;
  bool ignore_eos = false;
};

// Parses a generation request's body. kInvalidArgument naming the problem (not JSON,
// too deep, a field of the wrong type or out of range, an unknown field).
Result<GenerationRequest> ParseGenerationRequest(Endpoint endpoint, std::string_view body);

// A body that is a JSON object (kInvalidArgument otherwise), depth-checked.
Result<nlohmann::json> ParseObject(std::string_view body);

// Checks that `body`'s keys are all in `known` (the first unknown one named).
Status CheckKnownFields(const nlohmann::json& body, std::initializer_list<std::string_view> known);

// The HTTP status for a Status: 400 invalid argument / unsupported, 401 permission
// denied, 404 not found, 409 failed precondition, 503 exhausted, 500 otherwise.
int HttpStatusFor(const Status& status);
// OpenAI's error body: {"error": {"code": 400, "message": "...", "type": "invalid_request_error"}}.
nlohmann::json ErrorBody(int http_status, std::string_view message);

// A reply's JSON text: compact, invalid UTF-8 replaced (U+FFFD), and U+0085, U+2028 and
// U+2029 escaped (valid raw in JSON, but readers that split an SSE stream into lines
// with Unicode's line breaks, as Python's str.splitlines does, cut a frame there).
std::string DumpJson(const nlohmann::json& j);

// The UTF-8 text of `text` that is safe to send: everything but an incomplete
// multi-byte sequence at its end (its length in bytes).
size_t CompleteUtf8Prefix(std::string_view text);
// Where the first stop string occurs in text (npos: none), and how many trailing bytes
// of text could still begin one (held back from a stream until the next token says).
size_t FindStop(std::string_view text, const std::vector<std::string>& stops, std::string* which);
size_t PartialStopSuffix(std::string_view text, const std::vector<std::string>& stops);

// A file name for POST /slots/{id}?action=save|restore: a plain name (no '/', not "."
// or "..", no NUL, at most 200 bytes, not starting with '.'), kInvalidArgument else.
Status CheckSessionFileName(std::string_view name);

}  // namespace tierkv::server
