// tests/runtime/server/server_test.cc
//
// The server in this process on a free loopback port, driven over HTTP with
// cpp-httplib's client, on the reference qwen3moe model (chatml). The real clients
// (curl, Node's fetch, python3-requests) and the SIGKILL restart run in
// tests/runtime/server/clients.sh.
#include "runtime/server/server.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/kvcache/redis_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv::server {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kModel = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-q8_0.gguf";

class TempDir {
 public:
  TempDir() {
    std::mt19937_64 rng(std::random_device{}());
    path_ = fs::temp_directory_path() / ("tierkv-server-test-" + std::to_string(rng()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

ServerOptions Options(const std::string& session_dir = "") {
  ServerOptions o;
  o.run.model = kModel;
  o.run.threads = 1;
  o.run.auto_host = false;
  o.run.memory.host_bytes = 64ull << 20;
  o.run.memory.frame_bytes = 64 << 10;
  o.run.memory.warmup = false;
  o.run.memory.mlock = MlockMode::kOff;
  o.host = "127.0.0.1";
  o.port = 0;
  o.n_ctx = 512;
  o.n_slots = 2;
  o.session_dir = session_dir;
  return o;
}

struct Running {
  std::unique_ptr<Server> server;
  std::unique_ptr<httplib::Client> client;
};

Running StartServer(ServerOptions o) {
  Running r;
  auto s = Server::Start(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().message();
  if (!s.ok()) return r;
  r.server = std::move(*s);
  EXPECT_TRUE(r.server->WaitLoaded().ok());
  r.client = std::make_unique<httplib::Client>("127.0.0.1", r.server->port());
  r.client->set_read_timeout(120, 0);
  return r;
}

json Post(httplib::Client& c, const std::string& path, const json& body, int expect = 200) {
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << path;
  if (!res) return {};
  EXPECT_EQ(res->status, expect) << path << " " << res->body;
  return json::parse(res->body, nullptr, false);
}

json Chat(const std::vector<std::pair<std::string, std::string>>& turns, int max_tokens = 8) {
  json messages = json::array();
  for (const auto& [role, content] : turns) messages.push_back({{"role", role}, {"content", content}});
  return {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

TEST(ServerTest, HealthModelsAndChat) {
  TIERKV_NEED_REFERENCE(kModel);
  Running r = StartServer(Options());
  ASSERT_TRUE(r.client);
  auto health = r.client->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  EXPECT_EQ(health->get_header_value("Access-Control-Allow-Origin"), "*");
  auto models = r.client->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "ref-qwen3moe-q8_0.gguf");

  const json reply = Post(*r.client, "/v1/chat/completions", Chat({{"user", "Hello there"}}));
  ASSERT_TRUE(reply.is_object());
  EXPECT_EQ(reply["object"], "chat.completion");
  EXPECT_EQ(reply["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(reply["usage"]["completion_tokens"], 8);
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(reply["timings"]["prompt_n"].get<int>(), 0);

  // The same prompt through /completion (the chat format applied by /apply-template):
  // the same text, and its prompt reused from the slot but for the last token.
  const json tmpl = Post(*r.client, "/apply-template", {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}}});
  const json raw = Post(*r.client, "/completion", {{"prompt", tmpl["prompt"]}, {"n_predict", 8}, {"temperature", 0}});
  EXPECT_EQ(raw["content"], reply["choices"][0]["message"]["content"]);
  EXPECT_EQ(raw["timings"]["cache_n"].get<int>(), reply["usage"]["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(raw["stop_type"], "limit");
}

TEST(ServerTest, StreamingEqualsNonStreaming) {
  TIERKV_NEED_REFERENCE(kModel);
  Running r = StartServer(Options());
  ASSERT_TRUE(r.client);
  json body = Chat({{"system", "Answer."}, {"user", "Tell me a story about a lighthouse"}}, 12);
  body["cache_prompt"] = false;
  const json whole = Post(*r.client, "/v1/chat/completions", body);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto res = r.client->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::string text, finish;
  bool done = false, usage = false;
  size_t at = 0;
  while ((at = res->body.find("data: ", at)) != std::string::npos) {
    const size_t end = res->body.find("\n\n", at);
    const std::string payload = res->body.substr(at + 6, end - at - 6);
    at = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json chunk = json::parse(payload);
    if (chunk["choices"].empty()) {
      usage = chunk.contains("usage");
      continue;
    }
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) text += delta["content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);
}

// The conversation's second turn reuses the first turn's prompt and reply; the third,
// after a restart on the same --session-dir, reuses all of it from the saved file, and
// its tokens equal those of a server that never stopped.
TEST(ServerTest, ConversationSurvivesARestart) {
  TIERKV_NEED_REFERENCE(kModel);
  TempDir dir;
  const std::vector<std::string> users = {"Hello, who are you?", "Tell me more.", "And then?"};
  const auto run_turns = [&](Running& r, std::vector<std::pair<std::string, std::string>>& history, size_t from,
                             size_t to, std::vector<json>* replies) {
    for (size_t t = from; t < to; ++t) {
      history.emplace_back("user", users[t]);
      const json reply = Post(*r.client, "/v1/chat/completions", Chat(history, 6));
      replies->push_back(reply);
      history.emplace_back("assistant", reply["choices"][0]["message"]["content"].get<std::string>());
    }
  };
  std::vector<json> straight, restarted;
  {
    Running r = StartServer(Options());
    ASSERT_TRUE(r.client);
    std::vector<std::pair<std::string, std::string>> history;
    run_turns(r, history, 0, 3, &straight);
  }
  std::vector<std::pair<std::string, std::string>> history;
  {
    Running r = StartServer(Options(dir.str()));
    ASSERT_TRUE(r.client);
    run_turns(r, history, 0, 2, &restarted);
    // The second turn reused the first turn's tokens.
    EXPECT_GT(restarted[1]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              restarted[0]["usage"]["prompt_tokens"].get<int>());
  }
  {
    Running r = StartServer(Options(dir.str()));
    ASSERT_TRUE(r.client);
    run_turns(r, history, 2, 3, &restarted);
  }
  ASSERT_EQ(restarted.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(restarted[t]["choices"][0]["message"]["content"], straight[t]["choices"][0]["message"]["content"]) << t;
  }
  // After the restart only the new turn was computed.
  const json& third = restarted[2];
  const int cached = third["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  const int prompt = third["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(third["timings"]["prompt_n"].get<int>(), prompt - cached);
  EXPECT_GT(cached, restarted[1]["usage"]["prompt_tokens"].get<int>());
}

TEST(ServerTest, SlotsSaveRestoreEraseInsideTheSessionDir) {
  TIERKV_NEED_REFERENCE(kModel);
  TempDir dir;
  Running r = StartServer(Options(dir.str()));
  ASSERT_TRUE(r.client);
  const json reply = Post(*r.client, "/completion", {{"prompt", "The quick brown fox"}, {"n_predict", 4}, {"temperature", 0}, {"id_slot", 1}});
  EXPECT_EQ(reply["id_slot"], 1);
  const json saved = Post(*r.client, "/slots/1?action=save", {{"filename", "fox.tkv"}});
  EXPECT_GT(saved["n_saved"].get<int>(), 0);
  EXPECT_TRUE(fs::exists(fs::path(dir.str()) / "fox.tkv"));
  const json erased = Post(*r.client, "/slots/1?action=erase", json::object());
  EXPECT_EQ(erased["n_erased"], saved["n_saved"]);
  auto slots = r.client->Get("/slots");
  ASSERT_TRUE(slots);
  EXPECT_EQ(json::parse(slots->body)[1]["tokens_cached"], 0);
  const json restored = Post(*r.client, "/slots/0?action=restore", {{"filename", "fox.tkv"}});
  EXPECT_EQ(restored["n_restored"], saved["n_saved"]);
  // Names that leave the directory, and a link inside it, are refused.
  fs::create_symlink("/etc/passwd", fs::path(dir.str()) / "link.tkv");
  for (const char* name : {"../escape.tkv", "sub/x.tkv", ".hidden", "link.tkv", ""}) {
    const json e = Post(*r.client, "/slots/0?action=save", {{"filename", name}}, 400);
    EXPECT_TRUE(e.contains("error")) << name;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir.str()).parent_path() / "escape.tkv"));
  Post(*r.client, "/slots/0?action=restore", {{"filename", "missing.tkv"}}, 404);
  Post(*r.client, "/slots/7?action=erase", json::object(), 404);
  Post(*r.client, "/slots/0?action=explode", json::object(), 400);
}

TEST(ServerTest, ApiKeysGuardAllButHealth) {
  TIERKV_NEED_REFERENCE(kModel);
  ServerOptions o = Options();
  o.api_keys = {"sekret"};
  Running r = StartServer(o);
  ASSERT_TRUE(r.client);
  EXPECT_EQ(r.client->Get("/health")->status, 200);
  auto no_key = r.client->Get("/v1/models");
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(json::parse(no_key->body)["error"]["type"], "authentication_error");
  httplib::Headers wrong = {{"Authorization", "Bearer nope"}};
  EXPECT_EQ(r.client->Get("/v1/models", wrong)->status, 401);
  httplib::Headers right = {{"Authorization", "Bearer sekret"}};
  EXPECT_EQ(r.client->Get("/v1/models", right)->status, 200);
  // A browser's preflight needs no key.
  auto pre = r.client->Options("/v1/chat/completions");
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
}

TEST(ServerTest, MetricsAreAPrometheusText) {
  TIERKV_NEED_REFERENCE(kModel);
  Running r = StartServer(Options());
  ASSERT_TRUE(r.client);
  Post(*r.client, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"temperature", 0}});
  auto m = r.client->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  std::istringstream in(m->body);
  std::string line;
  std::map<std::string, double> values;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    values[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  EXPECT_EQ(values["tierkv_requests_total"], 1);
  EXPECT_EQ(values["tierkv_tokens_predicted_total"], 3);
  EXPECT_GT(values["tierkv_prompt_tokens_total"], 0);
  EXPECT_GT(values["tierkv_tier_used_bytes{tier=\"host\"}"], 0);
  EXPECT_GT(values["tierkv_tier_budget_bytes{tier=\"host\"}"], 0);
  EXPECT_EQ(values.count("tierkv_tier_evictions_total{tier=\"host\"}"), 1u);
}

TEST(ServerTest, TokenizeDetokenizeProps) {
  TIERKV_NEED_REFERENCE(kModel);
  Running r = StartServer(Options());
  ASSERT_TRUE(r.client);
  const json t = Post(*r.client, "/tokenize", {{"content", "Hello world"}});
  ASSERT_TRUE(t["tokens"].is_array());
  EXPECT_FALSE(t["tokens"].empty());
  const json d = Post(*r.client, "/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(d["content"], "Hello world");
  const json pieces = Post(*r.client, "/tokenize", {{"content", "Hello"}, {"with_pieces", true}});
  EXPECT_TRUE(pieces["tokens"][0].contains("piece"));
  auto props = r.client->Get("/props");
  ASSERT_TRUE(props);
  const json p = json::parse(props->body);
  EXPECT_EQ(p["total_slots"], 2);
  EXPECT_EQ(p["default_generation_settings"]["n_ctx"], 512);
  EXPECT_EQ(p["chat_format"], "chatml");
}

// More requests than the queue holds: those past it get 503 with an error body, the
// others their replies, and the server stays healthy.
TEST(ServerTest, AFullQueueAnswers503) {
  TIERKV_NEED_REFERENCE(kModel);
  ServerOptions o = Options();
  o.n_slots = 1;
  o.max_queue = 1;
  Running r = StartServer(o);
  ASSERT_TRUE(r.client);
  // Each runs to the end of the context (hundreds of tokens). The first computes (seen
  // in /slots), then three arrive: one waits in the queue, two are turned away.
  const json body = {{"prompt", "Count"}, {"n_predict", -1}, {"ignore_eos", true}, {"temperature", 0}};
  std::vector<int> codes(4, 0);
  std::vector<std::string> bodies(4);
  const auto send = [&](int i) {
    httplib::Client c("127.0.0.1", r.server->port());
    c.set_read_timeout(300, 0);
    auto res = c.Post("/completion", body.dump(), "application/json");
    if (res) {
      codes[static_cast<size_t>(i)] = res->status;
      bodies[static_cast<size_t>(i)] = res->body;
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(send, 0);
  for (int spin = 0; spin < 5000; ++spin) {
    auto slots = r.client->Get("/slots");
    if (slots && json::parse(slots->body)[0]["is_processing"] == true) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int i = 1; i < 4; ++i) threads.emplace_back(send, i);
  for (auto& t : threads) t.join();
  int ok = 0, busy = 0;
  for (int i = 0; i < 4; ++i) {
    if (codes[static_cast<size_t>(i)] == 200) ++ok;
    if (codes[static_cast<size_t>(i)] == 503) {
      ++busy;
      EXPECT_EQ(json::parse(bodies[static_cast<size_t>(i)])["error"]["type"], "unavailable_error");
    }
  }
  EXPECT_EQ(codes[0], 200);
  EXPECT_EQ(ok, 2);  // the one computing and the one waiting
  EXPECT_EQ(busy, 2);
  EXPECT_EQ(r.client->Get("/health")->status, 200);
}

// A streaming client that goes away cancels its request: generation stops early, and
// what was computed stays in the slot.
TEST(ServerTest, ADisconnectedStreamCancelsItsWork) {
  TIERKV_NEED_REFERENCE(kModel);
  ServerOptions o = Options();
  o.n_slots = 1;
  Running r = StartServer(o);
  ASSERT_TRUE(r.client);
  const json body = {{"prompt", "Count"}, {"n_predict", -1}, {"ignore_eos", true}, {"temperature", 0}, {"stream", true}};
  {
    httplib::Client c("127.0.0.1", r.server->port());
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/completion";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
    auto res = c.send(req);
    EXPECT_GE(chunks, 1);
  }
  // The next request waits for the cancelled one; then the counters say what happened.
  Post(*r.client, "/completion", {{"prompt", "x"}, {"n_predict", 1}, {"temperature", 0}});
  auto m = r.client->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("tierkv_requests_cancelled_total 1\n"), std::string::npos) << m->body.substr(0, 2000);
  const size_t at = m->body.find("\ntierkv_tokens_predicted_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stod(m->body.substr(at + 31)), 500) << "generation went on to the end of the context";
}

// Every bad request is a 4xx with an OpenAI error body; the server stays healthy.
TEST(ServerTest, BadRequestsAreAnsweredAndTheServerStaysUp) {
  TIERKV_NEED_REFERENCE(kModel);
  ServerOptions o = Options();
  o.max_body_bytes = 1 << 20;
  Running r = StartServer(o);
  ASSERT_TRUE(r.client);
  const std::string long_prompt(600 * 40, 'x');
  std::string long_tokens = "[";
  for (int i = 0; i < 600; ++i) long_tokens += (i ? ",1" : "1");
  long_tokens += "]";
  struct Case {
    const char* method;
    std::string path, body;
    int status;
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/chat/completions", "", 400},
      {"POST", "/v1/chat/completions", "not json", 400},
      {"POST", "/v1/chat/completions", "{", 400},
      {"POST", "/v1/chat/completions", "[1,2]", 400},
      {"POST", "/v1/chat/completions", "{}", 400},
      {"POST", "/v1/chat/completions", R"({"messages": 1})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": []})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": -3})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "bogus": 1})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "id_slot": 9})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "stream": 1})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})", 400},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": ")" + long_prompt + R"("}]})", 400},
      {"POST", "/v1/chat/completions", std::string(2 << 20, ' '), 413},
      {"POST", "/v1/completions", R"({"prompt": 5})", 400},
      {"POST", "/v1/completions", R"({"prompt": ""})", 400},
      {"POST", "/v1/completions", R"({"prompt": [999999999]})", 400},
      {"POST", "/v1/completions", R"({"prompt": [-1]})", 400},
      {"POST", "/v1/completions", R"({"prompt": )" + long_tokens + "}", 400},
      {"POST", "/v1/completions", R"({"prompt": "x", "echo": true})", 400},
      {"POST", "/completion", R"({"prompt": "x", "n_predict": -9})", 400},
      {"POST", "/completion", R"({"prompt": "x", "top_p": "high"})", 400},
      {"POST", "/completion", R"({"prompt": "x", "cache_prompt": "yes"})", 400},
      {"POST", "/completion", R"({"prompt": "x", "n_probs": 3})", 400},
      {"POST", "/completion", R"({"prompt": "x", "stop": [1, 2]})", 400},
      {"POST", "/tokenize", R"({"content": 5})", 400},
      {"POST", "/tokenize", R"({"content": "x", "extra": 1})", 400},
      {"POST", "/detokenize", R"({"tokens": "abc"})", 400},
      {"POST", "/detokenize", R"({"tokens": [-5]})", 400},
      {"POST", "/detokenize", R"({"tokens": [99999999]})", 400},
      {"POST", "/apply-template", R"({"messages": "x"})", 400},
      {"POST", "/slots/0?action=save", R"({"filename": "x.tkv"})", 400},  // no --session-dir
      {"POST", "/slots/abc?action=erase", "{}", 404},
      {"POST", "/slots/99?action=erase", "{}", 404},
      {"POST", "/slots/0?action=melt", "{}", 400},
      {"GET", "/no/such/endpoint", "", 404},
      {"POST", "/v1/embeddings", R"({"input": "x"})", 404},
      {"POST", "/v1/chat/completions", std::string("{\"messages\": ") + std::string(5000, '[') , 400},
  };
  ASSERT_GE(cases.size(), 40u);
  for (const Case& c : cases) {
    httplib::Result res = std::string(c.method) == "GET" ? r.client->Get(c.path.c_str())
                                                         : r.client->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res) << c.path << " " << c.body.substr(0, 80);
    EXPECT_EQ(res->status, c.status) << c.path << " " << c.body.substr(0, 80) << " -> " << res->body;
    const json e = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << c.path << ": " << res->body.substr(0, 200);
    EXPECT_EQ(e["error"]["code"], c.status) << c.path;
    EXPECT_TRUE(e["error"]["message"].is_string()) << c.path;
    EXPECT_EQ(r.client->Get("/health")->status, 200) << "after " << c.path;
  }
  // And it still answers.
  const json ok = Post(*r.client, "/completion", {{"prompt", "Hello"}, {"n_predict", 2}, {"temperature", 0}});
  EXPECT_EQ(ok["tokens_predicted"], 2);
}


// --- the remote tier: servers sharing one Redis ------------------------------------

// A prompt of some 1,200 tokens (four or more full blocks of 64 KiB frames).
std::string LongPrompt() {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "Entry " + std::to_string(i) + ": the lighthouse keeper counted " + std::to_string(i * 7 % 13) +
            " ships passing the northern cape before the storm. ";
  }
  return text;
}

json Complete(httplib::Client& c, const std::string& prompt) {
  return Post(c, "/completion", {{"prompt", prompt}, {"n_predict", 8}, {"temperature", 0}, {"cache_prompt", true}});
}

double Metric(httplib::Client& c, const std::string& name) {
  auto res = c.Get("/metrics");
  if (!res) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

// Waits until a server's publishing backlog is sent.
void AwaitPublished(httplib::Client& c) {
  for (int i = 0; i < 400 && Metric(c, "tierkv_remote_pending_bytes") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Metric(c, "tierkv_remote_pending_bytes"), 0);
}

ServerOptions SharingOptions(const std::string& url, const std::string& session_dir = "",
                            const std::string& model = kModel) {
  ServerOptions o = Options(session_dir);
  o.run.model = model;
  o.n_ctx = 2048;
  o.run.remote.url = url;
  o.run.remote.timeout_ms = 200;
  return o;
}

// What a server without the remote tier answers (computed from the first token).
const json& ComputedAnswer() {
  static const json answer = [] {
    ServerOptions o = Options();
    o.n_ctx = 2048;
    Running r = StartServer(o);
    return r.client ? Complete(*r.client, LongPrompt()) : json();
  }();
  return answer;
}

// A prompt computed by one server is reused by another with its own session dir (and
// its own memory and disk tiers): only the last token computed; the tokens equal the
// computed ones, and those of the second server restarted on its session file.
TEST(ServerRemoteTest, ASecondServerReusesWhatTheFirstComputed) {
  TIERKV_NEED_REFERENCE(kModel);
  TIERKV_NEED_REDIS();
  testing::TestRedis redis;
  TempDir dir_a, dir_b;
  const json& computed = ComputedAnswer();
  ASSERT_TRUE(computed.is_object());
  Running a = StartServer(SharingOptions(redis.url(), dir_a.str()));
  ASSERT_TRUE(a.client);
  const json first = Complete(*a.client, LongPrompt());
  EXPECT_EQ(first["content"], computed["content"]);
  EXPECT_EQ(first["timings"]["cache_n"], 0);
  AwaitPublished(*a.client);
  EXPECT_GE(Metric(*a.client, "tierkv_remote_published_blocks_total"), 4);
  const int prompt_n = first["tokens_evaluated"].get<int>();
  {
    Running b = StartServer(SharingOptions(redis.url(), dir_b.str()));
    ASSERT_TRUE(b.client);
    const json fetched = Complete(*b.client, LongPrompt());
    EXPECT_EQ(fetched["content"], computed["content"]) << "from Redis";
    // Every full block (of 256 tokens with 64 KiB frames); the partial last one is computed.
    const int cache_n = fetched["timings"]["cache_n"].get<int>();
    EXPECT_EQ(cache_n % 256, 0);
    EXPECT_GT(cache_n, prompt_n - 256);
    EXPECT_EQ(fetched["timings"]["prompt_n"], prompt_n - cache_n);
    EXPECT_GE(Metric(*b.client, "tierkv_remote_hit_blocks_total"), 4);
    EXPECT_EQ(Metric(*b.client, "tierkv_remote_verify_failures_total"), 0);
    EXPECT_EQ(Metric(*b.client, "tierkv_remote_connected"), 1);
  }
  // B again, restarted: its session file has the conversation now.
  redis.Kill();
  Running b = StartServer(SharingOptions(redis.url(), dir_b.str()));
  ASSERT_TRUE(b.client);
  const json restored = Complete(*b.client, LongPrompt());
  EXPECT_EQ(restored["content"], computed["content"]) << "from the local session";
  EXPECT_GT(restored["timings"]["cache_n"].get<int>(), prompt_n / 2);
}

// Whatever Redis does - killed, stopped mid-fetch, flushed, restarted, full, holding
// damaged, truncated or foreign values - every request completes with the computed tokens.
TEST(ServerRemoteTest, EveryFaultStillAnswersTheComputedTokens) {
  TIERKV_NEED_REFERENCE(kModel);
  TIERKV_NEED_REDIS();
  const json& computed = ComputedAnswer();
  ASSERT_TRUE(computed.is_object());
  const std::string f16 = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-f16.gguf";
  struct Case {
    const char* name;
    // Done to Redis after server A published the prompt (A's value keys given).
    std::function<void(testing::TestRedis&, const std::vector<std::string>&)> fault;
    bool pause_mid_fetch = false;
    bool damaged = false;  // B must count a verification failure
  };
  const auto flip = [](testing::TestRedis& r, const std::vector<std::string>& keys) {
    const std::string v = r.Command({"GET", keys[keys.size() / 2]});
    r.Command({"SETRANGE", keys[keys.size() / 2], "4000", std::string(1, static_cast<char>(v[4000] ^ 0x20))});
  };
  const auto truncate = [](testing::TestRedis& r, const std::vector<std::string>& keys) {
    r.Command({"SET", keys[0], r.Command({"GET", keys[0]}).substr(0, 100)});
  };
  // The same prompt's blocks from another model (f16 weights) or codec (q8_0), put under
  // A's keys.
  const auto foreign = [&](testing::TestRedis& r, const std::vector<std::string>& keys, bool codec) {
    const auto before = r.Keys("tkv:*");
    ServerOptions oo = SharingOptions(r.url(), "", codec ? kModel : f16);
    if (codec) oo.run.kv_type = KvCodec::kQ8_0;
    Running other = StartServer(oo);
    ASSERT_TRUE(other.client);
    Complete(*other.client, LongPrompt());
    AwaitPublished(*other.client);
    std::vector<std::string> theirs;
    for (const std::string& k : r.Keys("tkv:*:0")) {
      if (std::find(before.begin(), before.end(), k) == before.end()) theirs.push_back(k);
    }
    ASSERT_FALSE(theirs.empty());
    for (size_t i = 0; i < keys.size(); ++i) r.Command({"SET", keys[i], r.Command({"GET", theirs[i % theirs.size()]})});
  };
  const std::vector<Case> cases = {
      {"killed", [](testing::TestRedis& r, const auto&) { r.Kill(); }},
      {"stopped mid-fetch", [](testing::TestRedis&, const auto&) {}, /*pause_mid_fetch=*/true},
      {"flushed", [](testing::TestRedis& r, const auto&) { EXPECT_EQ(r.Command({"FLUSHALL"}), "OK"); }},
      {"restarted", [](testing::TestRedis& r, const auto&) { r.Kill(); r.Start(); }},
      {"full", [](testing::TestRedis& r, const auto&) {
         EXPECT_EQ(r.Command({"FLUSHALL"}), "OK");
         EXPECT_EQ(r.Command({"CONFIG", "SET", "maxmemory", "1"}), "OK");  // every write refused
       }},
      {"a flipped byte", flip, false, true},
      {"a truncated value", truncate, false, true},
      {"another model's values", [&](testing::TestRedis& r, const auto& k) { foreign(r, k, false); }, false, true},
      {"another codec's values", [&](testing::TestRedis& r, const auto& k) { foreign(r, k, true); }, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    testing::TestRedis redis;
    {
      Running a = StartServer(SharingOptions(redis.url()));
      ASSERT_TRUE(a.client);
      Complete(*a.client, LongPrompt());
      AwaitPublished(*a.client);
    }
    std::vector<std::string> values = redis.Keys("tkv:*:0");
    std::sort(values.begin(), values.end());
    ASSERT_GE(values.size(), 4u);
    c.fault(redis, values);
    ServerOptions ob = SharingOptions(redis.url());
    if (c.pause_mid_fetch) ob.run.remote.before_fetch = [&redis] { redis.Pause(); };
    Running b = StartServer(ob);
    ASSERT_TRUE(b.client);
    const json answer = Complete(*b.client, LongPrompt());
    EXPECT_EQ(answer["content"], computed["content"]);
    if (c.damaged) {
      EXPECT_GE(Metric(*b.client, "tierkv_remote_verify_failures_total"), 1);
      EXPECT_LT(answer["timings"]["cache_n"].get<int>(), answer["tokens_evaluated"].get<int>() - 1);
    }
    // Its own blocks go out when Redis takes them (the full one refuses them).
    if (c.pause_mid_fetch) redis.Resume();
    AwaitPublished(*b.client);
  }
}

}  // namespace
}  // namespace tierkv::server
