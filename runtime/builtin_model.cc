// runtime/builtin_model.cc
#include "runtime/builtin_model.h"

#include <cmath>
#include <cstring>

#include "kernels/quant.h"
#include "memory/rng.h"
#include "runtime/gguf_writer.h"

namespace tierkv {
namespace {

// Uniform in [-1, 1).
float Symmetric(SplitMix64& rng) { return static_cast<float>(2.0 * rng.Uniform() - 1.0); }

// A matrix of `rows` rows of `cols` values, uniform in [-scale, scale) times the
// row's own factor, quantised to Q8_0.
std::vector<uint8_t> Q8Matrix(SplitMix64& rng, int64_t cols, int64_t rows, float scale,
                              const std::vector<float>& row_factor = {}) {
  const size_t row_bytes = kernels::RowBytes(kernels::WeightType::kQ8_0, cols);
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float f = row_factor.empty() ? 1.0f : row_factor[static_cast<size_t>(r)];
    for (float& v : row) v = scale * f * Symmetric(rng);
    kernels::QuantizeActivation(kernels::WeightType::kQ8_0, row.data(), out.data() + static_cast<size_t>(r) * row_bytes,
                                cols);
  }
  return out;
}

// n f32 values around `center`.
std::vector<uint8_t> F32Vector(SplitMix64& rng, int64_t n, float center, float spread) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const float v = center + spread * Symmetric(rng);
    std::memcpy(out.data() + static_cast<size_t>(i) * sizeof(float), &v, sizeof(float));
  }
  return out;
}

// The metadata both synthetic architectures share: names, context and attention shape.
void AttentionKeys(GgufWriter& w, const std::string& arch, const std::string& name, int context, int n_embd,
                   int n_layer, int n_head, int n_head_kv, int head_dim) {
  const std::string a = arch + ".";
  w.String("general.architecture", arch)
      .String("general.name", name)
      .U32("general.alignment", 32)
      .U32(a + "context_length", static_cast<uint32_t>(context))
      .U32(a + "embedding_length", static_cast<uint32_t>(n_embd))
      .U32(a + "block_count", static_cast<uint32_t>(n_layer))
      .U32(a + "attention.head_count", static_cast<uint32_t>(n_head))
      .U32(a + "attention.head_count_kv", static_cast<uint32_t>(n_head_kv))
      .U32(a + "attention.key_length", static_cast<uint32_t>(head_dim))
      .U32(a + "attention.value_length", static_cast<uint32_t>(head_dim));
}

// A qwen3moe-shaped model; tiny-moe is the default shape with its own seed.
std::vector<uint8_t> MoeImage(const SyntheticMoeShape& s, uint64_t seed, const std::string& name) {
  SplitMix64 rng(seed);
  GgufWriter w;
  const std::string a = "qwen3moe.";
  AttentionKeys(w, "qwen3moe", name, s.context_length, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim);
  w.F32(a + "attention.layer_norm_rms_epsilon", s.rms_eps)
      .F32(a + "rope.freq_base", s.rope_freq_base)
      .U32(a + "expert_count", static_cast<uint32_t>(s.n_expert))
      .U32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used))
      .U32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp))
      .Bool(a + "expert_weights_norm", true)
      .String("tokenizer.ggml.model", "none");

  using GT = GgmlType;
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const float embd_scale = 1.0f;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  const int64_t q_dim = static_cast<int64_t>(s.n_head) * s.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.n_head_kv) * s.head_dim;
  w.Tensor("token_embd.weight", GT::kQ8_0, {u(s.n_embd), u(s.n_vocab)}, Q8Matrix(rng, s.n_embd, s.n_vocab, embd_scale));
  w.Tensor("output_norm.weight", GT::kF32, {u(s.n_embd)}, F32Vector(rng, s.n_embd, 1.0f, 0.1f));
  w.Tensor("output.weight", GT::kQ8_0, {u(s.n_embd), u(s.n_vocab)}, Q8Matrix(rng, s.n_embd, s.n_vocab, 4 * in_scale));
  // Router rows: expert e's logits scaled by 0.5 + 2 e^(-e / 6), so that low ids win
  // the top-k more often (skewed popularity), as trained routers do.
  std::vector<float> router_factor(static_cast<size_t>(s.n_expert));
  for (int e = 0; e < s.n_expert; ++e) router_factor[static_cast<size_t>(e)] = 0.5f + 2.0f * std::exp(-e / 6.0f);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    w.Tensor(p + "attn_norm.weight", GT::kF32, {u(s.n_embd)}, F32Vector(rng, s.n_embd, 1.0f, 0.1f));
    w.Tensor(p + "attn_q.weight", GT::kQ8_0, {u(s.n_embd), u(q_dim)}, Q8Matrix(rng, s.n_embd, q_dim, in_scale));
    w.Tensor(p + "attn_k.weight", GT::kQ8_0, {u(s.n_embd), u(kv_dim)}, Q8Matrix(rng, s.n_embd, kv_dim, in_scale));
    w.Tensor(p + "attn_v.weight", GT::kQ8_0, {u(s.n_embd), u(kv_dim)}, Q8Matrix(rng, s.n_embd, kv_dim, in_scale));
    w.Tensor(p + "attn_output.weight", GT::kQ8_0, {u(q_dim), u(s.n_embd)},
             Q8Matrix(rng, q_dim, s.n_embd, 1.0f / std::sqrt(static_cast<float>(q_dim))));
    w.Tensor(p + "attn_q_norm.weight", GT::kF32, {u(s.head_dim)}, F32Vector(rng, s.head_dim, 1.0f, 0.1f));
    w.Tensor(p + "attn_k_norm.weight", GT::kF32, {u(s.head_dim)}, F32Vector(rng, s.head_dim, 1.0f, 0.1f));
    w.Tensor(p + "ffn_norm.weight", GT::kF32, {u(s.n_embd)}, F32Vector(rng, s.n_embd, 1.0f, 0.1f));
    w.Tensor(p + "ffn_gate_inp.weight", GT::kQ8_0, {u(s.n_embd), u(s.n_expert)},
             Q8Matrix(rng, s.n_embd, s.n_expert, 4 * in_scale, router_factor));
    const int64_t exp_rows = static_cast<int64_t>(s.n_ff_exp) * s.n_expert;
    w.Tensor(p + "ffn_gate_exps.weight", GT::kQ8_0, {u(s.n_embd), u(s.n_ff_exp), u(s.n_expert)},
             Q8Matrix(rng, s.n_embd, exp_rows, in_scale));
    w.Tensor(p + "ffn_up_exps.weight", GT::kQ8_0, {u(s.n_embd), u(s.n_ff_exp), u(s.n_expert)},
             Q8Matrix(rng, s.n_embd, exp_rows, in_scale));
    w.Tensor(p + "ffn_down_exps.weight", GT::kQ8_0, {u(s.n_ff_exp), u(s.n_embd), u(s.n_expert)},
             Q8Matrix(rng, s.n_ff_exp, static_cast<int64_t>(s.n_embd) * s.n_expert,
                      1.0f / std::sqrt(static_cast<float>(s.n_ff_exp))));
  }
  return w.Finish();
}

std::vector<uint8_t> SyntheticLlamaImage(const SyntheticLlamaShape& s) {
  SplitMix64 rng(0x6c6c'616d'6173'796eull ^ static_cast<uint64_t>(s.n_embd * 131 + s.n_layer));
  constexpr int kVocab = 258;
  GgufWriter w;
  const std::string a = "llama.";
  AttentionKeys(w, "llama", "tierkv synthetic llama", 262144, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim);
  w.U32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff))
      .U32(a + "rope.dimension_count", static_cast<uint32_t>(s.head_dim))
      .F32(a + "attention.layer_norm_rms_epsilon", 1e-5f)
      .F32(a + "rope.freq_base", 500000.0f)
      .String("tokenizer.ggml.model", "none");
  using GT = GgmlType;
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const auto inv_sqrt = [](int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  const int64_t q_dim = static_cast<int64_t>(s.n_head) * s.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.n_head_kv) * s.head_dim;
  // A Q8_0 matrix of `rows` rows of `cols` values, uniform in [-scale, scale).
  auto matrix = [&](const std::string& name, int64_t cols, int64_t rows, float scale) {
    w.Tensor(name, GT::kQ8_0, {u(cols), u(rows)}, Q8Matrix(rng, cols, rows, scale));
  };
  auto norm = [&](const std::string& name) {
    w.Tensor(name, GT::kF32, {u(s.n_embd)}, F32Vector(rng, s.n_embd, 1.0f, 0.1f));
  };
  matrix("token_embd.weight", s.n_embd, kVocab, 1.0f);
  norm("output_norm.weight");
  matrix("output.weight", s.n_embd, kVocab, 4 * inv_sqrt(s.n_embd));
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", s.n_embd, q_dim, inv_sqrt(s.n_embd));
    matrix(p + "attn_k.weight", s.n_embd, kv_dim, inv_sqrt(s.n_embd));
    matrix(p + "attn_v.weight", s.n_embd, kv_dim, inv_sqrt(s.n_embd));
    matrix(p + "attn_output.weight", q_dim, s.n_embd, inv_sqrt(q_dim));
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", s.n_embd, s.n_ff, inv_sqrt(s.n_embd));
    matrix(p + "ffn_up.weight", s.n_embd, s.n_ff, inv_sqrt(s.n_embd));
    matrix(p + "ffn_down.weight", s.n_ff, s.n_embd, inv_sqrt(s.n_ff));
  }
  return w.Finish();
}

}  // namespace

Result<std::unique_ptr<GgufFile>> BuildSyntheticLlama(const SyntheticLlamaShape& shape) {
  return GgufFile::ParseOwned(SyntheticLlamaImage(shape), "synthetic-llama");
}

Result<std::unique_ptr<GgufFile>> BuildSyntheticMoe(const SyntheticMoeShape& shape) {
  return GgufFile::ParseOwned(MoeImage(shape, 0x6d6f'6573'796e'7468ull, "tierkv synthetic moe"), "synthetic-moe");
}

std::vector<std::string> BuiltinModelNames() { return {"tiny-moe"}; }

Result<std::unique_ptr<GgufFile>> BuildBuiltinModel(std::string_view name) {
  if (name == "tiny-moe") {
    // "tinymoe", version 1: changing the seed or the recipe changes the model.
    return GgufFile::ParseOwned(MoeImage(SyntheticMoeShape{}, 0x7469'6e79'6d6f'6501ull, "tierkv tiny-moe"),
                                std::string(kBuiltinPrefix) + "tiny-moe");
  }
  std::string known;
  for (const std::string& n : BuiltinModelNames()) known += (known.empty() ? "" : ", ") + std::string(kBuiltinPrefix) + n;
  return Status::NotFound("unknown builtin model '" + EscapeGgufString(name) + "' (builtin models: " + known + ")");
}

Result<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& spec) {
  if (spec.starts_with(kBuiltinPrefix)) return BuildBuiltinModel(std::string_view(spec).substr(kBuiltinPrefix.size()));
  return GgufFile::Open(spec);
}

}  // namespace tierkv
