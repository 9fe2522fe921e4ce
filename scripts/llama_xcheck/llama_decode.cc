// scripts/llama_xcheck/llama_decode.cc: llama.cpp's speed on a GGUF read through mmap
// (its default), for scripts/moe_bench.sh and scripts/serve_restart_bench.py: the prompt
// in batches of 512 (llama-server's n_ubatch), then N greedy tokens one at a time; prints
// one JSON line {prompt_tokens, prefill_tok_s, decode_tok_s, peak_rss_bytes, ...}.
// The weights are read in place from the mapping (no repacking), the way a file larger
// than RAM has to be run. Optional: flash attention (-1 auto, llama.cpp's default; 0 off;
// 1 on) and the KV cache type (f16, q8_0, q4_0: K and V alike; quantized V needs flash
// attention), for scripts/llama_compare.py.
//
//   llama_decode BACKEND.so MODEL.gguf PROMPT|@FILE N THREADS [FLASH_ATTN [KV_TYPE]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "ggml-backend.h"
#include "llama.h"

static double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char** argv) {
  if (argc < 6 || argc > 8) {
    fprintf(stderr, "usage: llama_decode BACKEND.so MODEL.gguf PROMPT|@FILE N THREADS [FLASH_ATTN [KV_TYPE]]\n");
    return 2;
  }
  const int flash_attn = argc > 6 ? atoi(argv[6]) : -1;
  const std::string kv_type = argc > 7 ? argv[7] : "f16";
  const ggml_type kv = kv_type == "q8_0" ? GGML_TYPE_Q8_0 : kv_type == "q4_0" ? GGML_TYPE_Q4_0 : GGML_TYPE_F16;
  if (kv_type != "f16" && kv_type != "q8_0" && kv_type != "q4_0") {
    fprintf(stderr, "KV_TYPE: f16, q8_0 or q4_0\n");
    return 2;
  }
  llama_log_set([](ggml_log_level lvl, const char* t, void*) { if (lvl >= GGML_LOG_LEVEL_ERROR) fputs(t, stderr); }, nullptr);
  if (!ggml_backend_load(argv[1])) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
  llama_backend_init();
  const double t_load = Now();
  auto mp = llama_model_default_params();
  mp.n_gpu_layers = 0;  // mmap on, mlock off: llama.cpp's defaults
  // Weights stay in the mapping: no repacking into anonymous buffers (llama-cli's
  // --no-repack). With it, the Q4_K tensors are copied into ~13 GiB of anonymous memory
  // and a run under a 6 GiB cgroup is killed by the OOM killer (2026-12-05).
  mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (!model) { fprintf(stderr, "cannot load model\n"); return 1; }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_gen = atoi(argv[4]), threads = atoi(argv[5]);
  std::string text = argv[3];
  if (!text.empty() && text[0] == '@') {  // @FILE: the prompt's text from a file (long prompts pass no argv limit)
    FILE* f = fopen(text.c_str() + 1, "rb");
    if (f == nullptr) { fprintf(stderr, "cannot read %s\n", text.c_str() + 1); return 1; }
    text.clear();
    char buf[65536];
    for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
    fclose(f);
  }
  std::vector<llama_token> ids(text.size() + 16);
  const int n = llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(), (int)ids.size(), true, true);
  if (n <= 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
  ids.resize(n);
  auto cp = llama_context_default_params();
  cp.n_ctx = n + n_gen + 16 > 4096 ? n + n_gen + 16 : 4096;
  cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = threads; cp.n_threads_batch = threads;
  cp.no_perf = true;
  cp.flash_attn_type = static_cast<llama_flash_attn_type>(flash_attn);
  cp.type_k = kv;
  cp.type_v = kv;
  llama_context* ctx = llama_init_from_model(model, cp);
  const double load_s = Now() - t_load;
  const double t0 = Now();
  for (int at = 0; at < n; at += 512) {
    const int m = n - at < 512 ? n - at : 512;
    if (llama_decode(ctx, llama_batch_get_one(ids.data() + at, m)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
  }
  const double prefill_s = Now() - t0;
  const int nv = llama_vocab_n_tokens(vocab);
  llama_token tok = 0;
  const double t1 = Now();
  for (int i = 0; i < n_gen; ++i) {
    const float* l = llama_get_logits_ith(ctx, -1);
    tok = 0;
    for (int v = 1; v < nv; ++v) if (l[v] > l[tok]) tok = v;
    if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
  }
  const double decode_s = Now() - t1;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"prompt_tokens\": %d, \"generated\": %d, \"load_s\": %.3f, \"prefill_s\": %.3f, \"decode_s\": %.3f, "
         "\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"peak_rss_bytes\": %lld}\n",
         n, n_gen, load_s, prefill_s, decode_s, n / prefill_s, n_gen / decode_s, 1024LL * ru.ru_maxrss);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
