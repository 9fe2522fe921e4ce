// Dev tool: llama.cpp token ids for a list of texts (hex-encoded bytes), in two modes.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "llama.h"
#include "ggml-backend.h"
using nlohmann::json;
static std::string Unhex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s.push_back((char)std::stoi(h.substr(i, 2), nullptr, 16));
  return s;
}
static std::vector<int> Tok(const llama_vocab* v, const std::string& t, bool add, bool parse) {
  std::vector<llama_token> ids(t.size() * 2 + 16);
  int n = llama_tokenize(v, t.data(), (int)t.size(), ids.data(), (int)ids.size(), add, parse);
  if (n < 0) { ids.resize(-n); n = llama_tokenize(v, t.data(), (int)t.size(), ids.data(), (int)ids.size(), add, parse); }
  return std::vector<int>(ids.begin(), ids.begin() + n);
}
int main(int argc, char** argv) {
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  ggml_backend_load(argv[1]);
  llama_backend_init();
  auto mp = llama_model_default_params(); mp.vocab_only = true;
  llama_model* m = llama_model_load_from_file(argv[2], mp);
  const llama_vocab* v = llama_model_get_vocab(m);
  json in; std::ifstream(argv[3]) >> in;
  json out = json::array();
  for (auto& h : in) {
    std::string t = Unhex(h);
    json e = {{"hex", h}};
    try { e["plain"] = Tok(v, t, false, false); e["special"] = Tok(v, t, true, true); } catch (...) { e["error"] = true; }
    out.push_back(e);
  }
  std::ofstream(argv[4]) << json{{"model", argv[2]}, {"cases", out}}.dump() << "\n";
  return 0;
}
