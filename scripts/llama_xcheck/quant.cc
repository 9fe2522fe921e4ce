// Dev tool: llama.cpp's own quantizer (llama_model_quantize) on one GGUF: quant BACKEND.so IN OUT FTYPE.
#include <cstdio>
#include <cstdlib>
#include "llama.h"
#include "ggml-backend.h"
int main(int argc, char** argv) {
  if (argc != 5) { fprintf(stderr, "usage: quant BACKEND.so IN OUT FTYPE\n"); return 2; }
  ggml_backend_load(argv[1]);
  llama_backend_init();
  auto p = llama_model_quantize_default_params();
  p.ftype = (llama_ftype)atoi(argv[4]); p.nthread = 2;
  return llama_model_quantize(argv[2], argv[3], &p) == 0 ? 0 : 1;
}
