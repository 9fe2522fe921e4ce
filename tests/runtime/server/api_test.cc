// tests/runtime/server/api_test.cc
#include "runtime/server/api.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace tierkv::server {
namespace {

TEST(ApiTest, ParsesAChatRequest) {
  auto r = ParseGenerationRequest(Endpoint::kChat, R"({
    "model": "m", "messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
                               {"role": "assistant", "content": null},
                               {"role": "developer", "content": "x"}],
    "max_tokens": 7, "temperature": 0, "top_k": 5, "seed": 42, "stop": ["\n\n", "END"], "stream": true,
    "stream_options": {"include_usage": true}, "user": "u", "n": 1, "logprobs": false, "tools": []})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[1].content, "hi there");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->messages[3].role, "system");
  EXPECT_EQ(r->n_predict, 7);
  EXPECT_EQ(r->sampler.temperature, 0.0f);
  EXPECT_EQ(r->sampler.top_k, 5);
  EXPECT_EQ(r->sampler.seed, 42u);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->cache_prompt);
}

TEST(ApiTest, ParsesCompletionPrompts) {
  auto text = ParseGenerationRequest(Endpoint::kLlamaCompletion,
                                     R"({"prompt": "abc", "n_predict": -1, "cache_prompt": false, "id_slot": 2, "n_keep": 4})");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text->prompt, "abc");
  EXPECT_EQ(text->n_predict, -1);
  EXPECT_FALSE(text->cache_prompt);
  EXPECT_EQ(text->id_slot, 2);
  auto ids = ParseGenerationRequest(Endpoint::kCompletions, R"({"prompt": [1, 2, 3], "max_tokens": 3})");
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_FALSE(ids->prompt.has_value());
  EXPECT_EQ(ids->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  auto batch_of_one = ParseGenerationRequest(Endpoint::kCompletions, R"({"prompt": ["x"]})");
  ASSERT_TRUE(batch_of_one.ok());
  EXPECT_EQ(*batch_of_one->prompt, "x");
}

// Each body is refused with kInvalidArgument or kUnsupported (400), naming the problem.
TEST(ApiTest, RefusesMalformedBodies) {
  const std::pair<Endpoint, const char*> cases[] = {
      {Endpoint::kChat, ""},
      {Endpoint::kChat, "{"},
      {Endpoint::kChat, "[]"},
      {Endpoint::kChat, "\"text\""},
      {Endpoint::kChat, R"({"messages": "hi"})"},
      {Endpoint::kChat, R"({"messages": []})"},
      {Endpoint::kChat, R"({})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user"}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "wizard", "content": "x"}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": 3, "content": "x"}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": 5}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x", "colour": 1}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_p": 2})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stop": 5})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 3})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "frobnicate": true})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "seed": -7})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "id_slot": "one"})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"x": 1}})"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})"},
      {Endpoint::kCompletions, R"({"prompt": 12})"},
      {Endpoint::kCompletions, R"({"prompt": []})"},
      {Endpoint::kCompletions, R"({"prompt": ["a", "b"]})"},
      {Endpoint::kCompletions, R"({"prompt": [1, -2]})"},
      {Endpoint::kCompletions, R"({"prompt": [1, 99999999999]})"},
      {Endpoint::kCompletions, R"({"prompt": "x", "echo": true})"},
      {Endpoint::kCompletions, R"({"prompt": "x", "suffix": "y"})"},
      {Endpoint::kCompletions, R"({"prompt": "x", "messages": []})"},
      {Endpoint::kLlamaCompletion, R"({"n_predict": 4})"},
      {Endpoint::kLlamaCompletion, R"({"prompt": "x", "n_probs": 5})"},
      {Endpoint::kLlamaCompletion, R"({"prompt": "x", "repeat_penalty": 0})"},
  };
  for (const auto& [endpoint, body] : cases) {
    auto r = ParseGenerationRequest(endpoint, body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_TRUE(r.status().code() == StatusCode::kInvalidArgument || r.status().code() == StatusCode::kUnsupported)
        << body << ": " << r.status().message();
    EXPECT_EQ(HttpStatusFor(r.status()), 400) << body;
    EXPECT_FALSE(r.status().message().empty()) << body;
  }
}

TEST(ApiTest, RefusesDeepNestingBeforeParsing) {
  std::string deep = R"({"messages": )";
  for (int i = 0; i < 100000; ++i) deep += "[";
  auto r = ParseGenerationRequest(Endpoint::kChat, deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deeper"), std::string::npos) << r.status().message();
  // Brackets inside strings are text.
  std::string in_string = R"({"prompt": ")" + std::string(200, '[') + R"("})";
  EXPECT_TRUE(ParseGenerationRequest(Endpoint::kCompletions, in_string).ok());
}

TEST(ApiTest, ErrorBodyIsOpenAiShaped) {
  const auto j = ErrorBody(404, "no such slot");
  EXPECT_EQ(j["error"]["code"], 404);
  EXPECT_EQ(j["error"]["message"], "no such slot");
  EXPECT_EQ(j["error"]["type"], "not_found_error");
  EXPECT_EQ(ErrorBody(401, "k")["error"]["type"], "authentication_error");
  EXPECT_EQ(HttpStatusFor(Status::NotFound("x")), 404);
  EXPECT_EQ(HttpStatusFor(Status::Exhausted("x")), 503);
  EXPECT_EQ(HttpStatusFor(Status::IoError("x")), 500);
}

TEST(ApiTest, DumpJsonEscapesUnicodeLineBreaks) {
  const nlohmann::json j = {{"content", "a\xE2\x80\xA8" "b\xC2\x85" "c\xE2\x80\xA9" "d \xC3\xA9 \xFF"}};
  const std::string s = DumpJson(j);
  EXPECT_EQ(s, "{\"content\":\"a\\u2028b\\u0085c\\u2029d \xC3\xA9 \xEF\xBF\xBD\"}") << s;
  EXPECT_EQ(nlohmann::json::parse(s)["content"], "a\xE2\x80\xA8" "b\xC2\x85" "c\xE2\x80\xA9" "d \xC3\xA9 \xEF\xBF\xBD");
}

TEST(ApiTest, Utf8PrefixHoldsBackIncompleteSequences) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3"), 1u);               // first byte of é
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3\xA9"), 3u);           // é whole
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x8C"), 0u);        // 3 of the 4 bytes of 🌍
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x8C\x8D"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
}

TEST(ApiTest, StopStringsAndTheirPrefixes) {
  const std::vector<std::string> stops = {"END", "\n\n"};
  std::string which;
  EXPECT_EQ(FindStop("abc END x", stops, &which), 4u);
  EXPECT_EQ(which, "END");
  EXPECT_EQ(FindStop("a\n\nb END", stops, &which), 1u);
  EXPECT_EQ(which, "\n\n");
  EXPECT_EQ(FindStop("abc", stops, nullptr), std::string::npos);
  EXPECT_EQ(PartialStopSuffix("abc EN", stops), 2u);
  EXPECT_EQ(PartialStopSuffix("abc\n", stops), 1u);
  EXPECT_EQ(PartialStopSuffix("abc", stops), 0u);
}

TEST(ApiTest, SessionFileNamesStayInTheDirectory) {
  EXPECT_TRUE(CheckSessionFileName("conv1.tkv").ok());
  for (const char* bad : {"", "../x", "a/b", "/etc/passwd", ".hidden", "..", ".", "a\\b"}) {
    EXPECT_FALSE(CheckSessionFileName(bad).ok()) << bad;
  }
  EXPECT_FALSE(CheckSessionFileName(std::string(201, 'a')).ok());
  EXPECT_FALSE(CheckSessionFileName(std::string("a\0b", 3)).ok());
}

// Random mutations of valid bodies: the parser answers every one (a request or a 400
// naming the problem), never crashes or throws.
TEST(ApiFuzzTest, MutatedBodiesAreAnsweredNeverFatal) {
  const std::pair<Endpoint, std::string> seeds[] = {
      {Endpoint::kChat,
       R"({"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"temperature":0.5,"stop":["x"],"stream":true})"},
      {Endpoint::kCompletions, R"({"prompt":[1,2,3],"max_tokens":4,"top_p":0.9,"seed":3})"},
      {Endpoint::kLlamaCompletion, R"({"prompt":"abc","n_predict":5,"cache_prompt":true,"id_slot":0,"return_progress":true})"},
  };
  const std::string alphabet = "{}[]\":,0123456789-.eE truefalsnul\\u00ff\xC3\xA9";
  std::mt19937 rng(20261206);
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const auto& [endpoint, seed] = seeds[static_cast<size_t>(iter) % std::size(seeds)];
    std::string body = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 4) {
        case 0: body.erase(at, 1 + rng() % 3); break;
        case 1: body.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 2: body[at] = alphabet[rng() % alphabet.size()]; break;
        default: body.insert(at, body.substr(rng() % body.size(), rng() % 8)); break;
      }
    }
    auto r = ParseGenerationRequest(endpoint, body);
    if (r.ok()) {
      ++accepted;
    } else {
      ++refused;
      ASSERT_EQ(HttpStatusFor(r.status()), 400) << body << ": " << r.status().message();
      ASSERT_FALSE(r.status().message().empty());
    }
  }
  // Both outcomes are exercised (a fuzz run that refuses everything tests little).
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 1000);
}

}  // namespace
}  // namespace tierkv::server
