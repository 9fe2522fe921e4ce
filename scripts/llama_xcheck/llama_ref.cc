// Dev tool: runs llama.cpp (libllama, CPU zen4 backend) on a GGUF + prompts and writes
// vectors in the schema of ../shared/reference/README.md; tolerances from llama.cpp's own
// variation between a one-batch prompt and a one-token-per-decode prompt (tok1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "llama.h"
#include "ggml-backend.h"
using nlohmann::json;

static llama_context* MakeCtx(llama_model* m) {
  auto cp = llama_context_default_params();
  cp.n_ctx = 4096; cp.n_batch = 4096; cp.n_ubatch = 4096; cp.n_threads = 2; cp.n_threads_batch = 2;
  cp.type_k = GGML_TYPE_F16; cp.type_v = GGML_TYPE_F16;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED; cp.no_perf = true;
  return llama_init_from_model(m, cp);
}

// Decodes ids[0..n) either in one batch (want logits at `positions`) or one token per call.
static std::vector<std::vector<float>> Prompt(llama_context* ctx, const std::vector<llama_token>& ids,
                                              const std::vector<int>& positions, bool tok1, int nv) {
  std::vector<std::vector<float>> out;
  if (!tok1) {
    llama_batch b = llama_batch_init((int)ids.size(), 0, 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      b.token[i] = ids[i]; b.pos[i] = (int)i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
      b.logits[i] = std::find(positions.begin(), positions.end(), (int)i) != positions.end();
    }
    b.n_tokens = (int)ids.size();
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); exit(1); }
    for (int p : positions) { const float* l = llama_get_logits_ith(ctx, p); out.emplace_back(l, l + nv); }
    llama_batch_free(b);
  } else {
    llama_batch b = llama_batch_init(1, 0, 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      b.token[0] = ids[i]; b.pos[0] = (int)i; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1; b.n_tokens = 1;
      if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); exit(1); }
      if (std::find(positions.begin(), positions.end(), (int)i) != positions.end()) {
        const float* l = llama_get_logits_ith(ctx, 0); out.emplace_back(l, l + nv);
      }
    }
    llama_batch_free(b);
  }
  return out;
}
static std::vector<float> Step(llama_context* ctx, llama_token t, int pos, int nv) {
  llama_batch b = llama_batch_init(1, 0, 1);
  b.token[0] = t; b.pos[0] = pos; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1; b.n_tokens = 1;
  if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); exit(1); }
  const float* l = llama_get_logits_ith(ctx, 0);
  std::vector<float> r(l, l + nv);
  llama_batch_free(b);
  return r;
}
static json Top(const std::vector<float>& l) {
  std::vector<int> idx(l.size());
  for (size_t i = 0; i < l.size(); ++i) idx[i] = (int)i;
  std::partial_sort(idx.begin(), idx.begin() + 10, idx.end(), [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  json t = json::array();
  for (int i = 0; i < 10; ++i) t.push_back({idx[i], l[idx[i]]});
  return t;
}
static double Lse(const std::vector<float>& l) {
  double m = -1e300; for (float v : l) m = std::max(m, (double)v);
  double s = 0; for (float v : l) s += std::exp((double)v - m);
  return m + std::log(s);
}
static int Argmax(const std::vector<float>& l) { int b = 0; for (size_t i = 1; i < l.size(); ++i) if (l[i] > l[b]) b = (int)i; return b; }
static double Round2(double x) {  // round up to 2 significant digits, >= 1e-3
  if (x <= 0) return 1e-3;
  double e = std::pow(10.0, std::floor(std::log10(x)) - 1);
  return std::max(1e-3, std::ceil(x / e - 1e-9) * e);
}

int main(int argc, char** argv) {
  if (argc != 5) { fprintf(stderr, "usage: llama_ref BACKEND.so MODEL.gguf PROMPTS.json OUT.json\n"); return 2; }
  llama_log_set([](ggml_log_level lvl, const char* t, void*) { if (lvl >= GGML_LOG_LEVEL_ERROR) fputs(t, stderr); }, nullptr);
  if (!ggml_backend_load(argv[1])) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
  llama_backend_init();
  auto mp = llama_model_default_params(); mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (!model) { fprintf(stderr, "cannot load model\n"); return 1; }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int nv = llama_vocab_n_tokens(vocab);
  json prompts; std::ifstream(argv[3]) >> prompts;
  json doc; doc["format"] = "llamacpp-ref-vectors/1";
  doc["model"] = {{"file", argv[2]}};
  doc["reference"] = {{"tool", "tierkv scripts/llama_xcheck (libllama from npm @node-llama-cpp/linux-x64 3.22.1)"}, {"backend", argv[1]}, {"system_info", llama_print_system_info()}};
  double maxd = 0, maxl = 0; std::vector<double> topd;
  json cases = json::array();
  for (auto& pr : prompts) {
    std::string text = pr["prompt"];
    std::vector<llama_token> ids(text.size() + 16);
    int n = llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(), (int)ids.size(), true, false);
    if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
    ids.resize(n);
    std::vector<int> pos;
    for (int i = 0; i < std::min(8, n); ++i) pos.push_back(i);
    for (int i = std::max(8, n - 8); i < n; ++i) pos.push_back(i);
    std::vector<std::vector<float>> rows[2];
    std::vector<int> greedy;
    for (int mode = 0; mode < 2; ++mode) {
      llama_context* ctx = MakeCtx(model);
      rows[mode] = Prompt(ctx, ids, pos, mode == 1, nv);
      std::vector<float> last = rows[mode].back();
      for (int s = 0; s < 32; ++s) {
        if (mode == 0) greedy.push_back(Argmax(last));
        if (s == 31) break;
        last = Step(ctx, greedy[s], n + s, nv);
        rows[mode].push_back(last);
      }
      llama_free(ctx);
    }
    // rows: [prompt positions..., greedy steps 1..31]; step 0 = last prompt row.
    json c; c["id"] = pr["id"]; c["prompt"] = text; c["n_prompt_tokens"] = n; c["prompt_ids"] = ids;
    json pp = json::array();
    for (size_t k = 0; k < pos.size(); ++k) pp.push_back({{"pos", pos[k]}, {"token", ids[pos[k]]}, {"top", Top(rows[0][k])}, {"logsumexp", Lse(rows[0][k])}});
    c["prompt_positions"] = pp;
    json gs = json::array();
    for (int s = 0; s < 32; ++s) {
      const auto& r = s == 0 ? rows[0][pos.size() - 1] : rows[0][pos.size() - 1 + s];
      gs.push_back({{"step", s}, {"pos", n - 1 + s}, {"top", Top(r)}, {"logsumexp", Lse(r)}});
    }
    c["greedy_ids"] = greedy; c["greedy_steps"] = gs;
    for (size_t k = 0; k < rows[0].size(); ++k) {
      for (int i = 0; i < nv; ++i) maxd = std::max(maxd, (double)std::fabs(rows[0][k][i] - rows[1][k][i]));
      for (auto& e : Top(rows[0][k])) { int id = e[0]; topd.push_back(std::fabs(rows[0][k][id] - rows[1][k][id])); }
      maxl = std::max(maxl, std::fabs(Lse(rows[0][k]) - Lse(rows[1][k])));
    }
    cases.push_back(c);
  }
  std::sort(topd.begin(), topd.end());
  const double p99 = topd[(size_t)std::floor(0.99 * (topd.size() - 1))];
  const double tol = Round2(4 * maxd);
  doc["tolerance"] = {{"logit_abs", tol}, {"logit_abs_p99", Round2(4 * p99)}, {"logsumexp_abs", Round2(4 * maxl)},
                      {"tok1_max_abs", maxd}, {"tok1_p99_top10", p99}, {"tok1_max_lse", maxl}};
  for (auto& c : cases) {
    int st = 0;
    for (auto& g : c["greedy_steps"]) { double a = g["top"][0][1], b = g["top"][1][1]; if (a - b >= 2 * tol) ++st; else break; }
    c["greedy_stable_prefix"] = st;
  }
  doc["cases"] = cases;
  std::ofstream(argv[4]) << doc.dump(1) << "\n";
  fprintf(stderr, "%s: tol %.3g (tok1 max %.3g)\n", argv[2], tol, maxd);
  llama_model_free(model);
  return 0;
}
