// runtime/make_model.cc
#include "runtime/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "kernels/fp16.h"
#include "memory/rng.h"
#include "kernels/ggml_types.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"

namespace tierkv {
namespace {

using GT = GgmlType;

// One tensor to write: its name, type, shape, and how its values are drawn.
struct Plan {
  enum class Kind { kMatrix, kNorm, kRouter };
  std::string name;
  GT type;
  std::vector<uint64_t> ne;
  Kind kind = Kind::kMatrix;
  int layer = -1;
};

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
// one in between, get more bits for attn_v and ffn_down under Q4_K_M.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The type of a matrix under the quantization `type` (llama.cpp's llama_tensor_get_type
// for Q4_K_M, for shapes whose rows are whole 256-value blocks and models of more than
// 8 experts: docs/make-model.md).
GT MatrixType(const std::string& type, const std::string& role, int layer, int n_layer) {
  if (type == "q8_0") return GT::kQ8_0;
  if (role == "output") return GT::kQ6_K;
  if ((role == "attn_v" || role == "ffn_down" || role == "ffn_down_exps") && UseMoreBits(layer, n_layer)) {
    return GT::kQ6_K;
  }
  return GT::kQ4_K;
}

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = kernels::F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// Random bytes, 8 at a time.
void RandomBytes(SplitMix64& rng, uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng.Next();
    std::memcpy(p + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = rng.Next();
    std::memcpy(p + i, &v, n - i);
  }
}

// Blocks of a quantized type with random codes and scales set so that the weights
// have mean about 0 and standard deviation about sigma. Block layouts (ggml):
//   Q8_0 [d f16][32 x i8]                       w = d q,            q in [-128, 127]
//   Q4_K [d][dmin][12 B scales][128 B codes]    w = d sc q - dmin m, sc, m, q 6/6/4-bit
//   Q5_K [d][dmin][12 B scales][32 B qh][128 B]  the same with 5-bit codes
//   Q6_K [128 B ql][64 B qh][16 x i8 scales][d]  w = d sc (q - 32),  q 6-bit
// (the standard deviations of the codes, with uniform random bits: about 74, 310, 620
// and 1370 times d).
void RandomBlocks(GT type, SplitMix64& rng, float sigma, uint8_t* out, uint64_t n_blocks) {
  const uint32_t bb = FindGgmlType(type)->block_bytes;
  RandomBytes(rng, out, static_cast<size_t>(n_blocks * bb));
  for (uint64_t b = 0; b < n_blocks; ++b) {
    uint8_t* p = out + b * bb;
    switch (type) {
      case GT::kQ8_0: PutHalf(p, sigma / 74.0f); break;
      case GT::kQ4_K:
        PutHalf(p, sigma / 310.0f);
        PutHalf(p + 2, 7.5f * sigma / 310.0f);  // dmin m cancels the mean of d sc q
        break;
      case GT::kQ5_K:
        PutHalf(p, sigma / 620.0f);
        PutHalf(p + 2, 15.5f * sigma / 620.0f);
        break;
      case GT::kQ6_K: PutHalf(p + 208, sigma / 1370.0f); break;
      default: break;
    }
  }
}

struct Shape {
  const MakeModelShape& s;
  int n_layer;  // written (a slice may be fewer than s.n_layer)
  int n_vocab;
};

std::vector<Plan> PlanTensors(const Shape& sh, const std::string& type) {
  const MakeModelShape& s = sh.s;
  const auto u = [](int v) { return static_cast<uint64_t>(v); };
  const bool moe = s.n_expert > 0;
  std::vector<Plan> plans;
  plans.push_back({"token_embd.weight", type == "q8_0" ? GT::kQ8_0 : GT::kQ4_K, {u(s.n_embd), u(sh.n_vocab)}});
  const int q_dim = s.n_head * s.head_dim, kv_dim = s.n_head_kv * s.head_dim;
  for (int l = 0; l < sh.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto mat = [&](const std::string& role, std::vector<uint64_t> ne) {
      plans.push_back({p + role + ".weight", MatrixType(type, role, l, s.n_layer), std::move(ne), Plan::Kind::kMatrix, l});
    };
    const auto norm = [&](const std::string& role, int n) {
      plans.push_back({p + role + ".weight", GT::kF32, {u(n)}, Plan::Kind::kNorm, l});
    };
    norm("attn_norm", s.n_embd);
    mat("attn_q", {u(s.n_embd), u(q_dim)});
    mat("attn_k", {u(s.n_embd), u(kv_dim)});
    mat("attn_v", {u(s.n_embd), u(kv_dim)});
    mat("attn_output", {u(q_dim), u(s.n_embd)});
    norm("attn_q_norm", s.head_dim);
    norm("attn_k_norm", s.head_dim);
    norm("ffn_norm", s.n_embd);
    if (moe) {
      plans.push_back({p + "ffn_gate_inp.weight", GT::kF32, {u(s.n_embd), u(s.n_expert)}, Plan::Kind::kRouter, l});
      mat("ffn_gate_exps", {u(s.n_embd), u(s.n_ff_exp), u(s.n_expert)});
      mat("ffn_up_exps", {u(s.n_embd), u(s.n_ff_exp), u(s.n_expert)});
      mat("ffn_down_exps", {u(s.n_ff_exp), u(s.n_embd), u(s.n_expert)});
    } else {
      mat("ffn_gate", {u(s.n_embd), u(s.n_ff)});
      mat("ffn_up", {u(s.n_embd), u(s.n_ff)});
      mat("ffn_down", {u(s.n_ff), u(s.n_embd)});
    }
  }
  plans.push_back({"output_norm.weight", GT::kF32, {u(s.n_embd)}, Plan::Kind::kNorm});
  plans.push_back({"output.weight", MatrixType(type, "output", 0, s.n_layer), {u(s.n_embd), u(sh.n_vocab)}});
  return plans;
}

// The gains of layer l's router rows: exp(skew z), z standard normal, from their own
// generator so that they do not depend on how the tensor is cut into chunks.
std::vector<float> RouterGains(uint64_t seed, int layer, int n_expert, double skew) {
  SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + 0x726f75746572ull + static_cast<uint64_t>(layer));
  std::vector<float> g(static_cast<size_t>(n_expert));
  for (float& v : g) v = static_cast<float>(std::exp(skew * rng.Normal()));
  return g;
}

}  // namespace

const std::vector<MakeModelShape>& MakeModelShapes() {
  static const std::vector<MakeModelShape> kShapes = {
      // like            arch        L   embd  H   KV  hd   ff     E    k  ff_e  vocab   ctx    rope   eps
      {"qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 128, 8, 768, 151936, 40960, 1e6f, 1e-6f},
      {"qwen3-235b-a22b", "qwen3moe", 94, 4096, 64, 4, 128, 12288, 128, 8, 1536, 151936, 40960, 1e6f, 1e-6f},
      {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 0, 0, 0, 151936, 40960, 1e6f, 1e-6f},
  };
  return kShapes;
}

namespace {

struct Prepared {
  GgufWriter w;
  std::vector<Plan> plans;
  const MakeModelShape* shape = nullptr;
  MakeModelReport report;
};

// Checks the options, writes the metadata and declares every tensor (streamed).
Result<Prepared> Prepare(const MakeModelOptions& o) {
  Prepared out;
  GgufWriter& w = out.w;
  const auto& shapes = MakeModelShapes();
  const auto it = std::find_if(shapes.begin(), shapes.end(), [&](const MakeModelShape& s) { return o.like == s.like; });
  if (it == shapes.end()) {
    std::string known;
    for (const auto& s : shapes) known += std::string(known.empty() ? "" : ", ") + s.like;
    return Status::InvalidArgument("--like " + o.like + ": no such model shape (" + known + ")");
  }
  const MakeModelShape& s = *it;
  out.shape = &s;
  if (o.type != "q4_k_m" && o.type != "q8_0") {
    return Status::InvalidArgument("--type " + o.type + ": make-model writes q4_k_m or q8_0");
  }
  if (o.layers < 0 || o.layers > s.n_layer) {
    return Status::InvalidArgument("--layers " + std::to_string(o.layers) + ": " + s.like + " has " +
                                   std::to_string(s.n_layer) + " layers");
  }
  if (!(o.skew >= 0.0 && o.skew <= 8.0)) return Status::InvalidArgument("--skew must be in [0, 8]");

  const std::string a = std::string(s.arch) + ".";
  const int n_layer = o.layers > 0 ? o.layers : s.n_layer;
  int n_vocab = 258;
  std::unique_ptr<GgufFile> vocab;
  if (!o.vocab_from.empty()) {
    TIERKV_ASSIGN_OR_RETURN(vocab, GgufFile::Open(o.vocab_from));
    const GgufValue* tokens = vocab->Find("tokenizer.ggml.tokens");
    if (tokens == nullptr || !tokens->is_array() || tokens->size() == 0 || tokens->size() > (1u << 24)) {
      return Status::InvalidArgument("--vocab-from " + o.vocab_from + ": no tokenizer.ggml.tokens array to take");
    }
    n_vocab = static_cast<int>(tokens->size());
  }
  w.String("general.architecture", s.arch)
      .String("general.name", std::string("tierkv make-model ") + s.like + " " + o.type + " seed " + std::to_string(o.seed))
      .U32("general.alignment", 32)
      .U32("general.file_type", o.type == "q8_0" ? 7 : 15)  // llama.cpp's LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_K_M
      .U32("general.quantization_version", 2)
      .U32(a + "context_length", static_cast<uint32_t>(s.context_length))
      .U32(a + "embedding_length", static_cast<uint32_t>(s.n_embd))
      .U32(a + "block_count", static_cast<uint32_t>(n_layer))
      .U32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff))
      .U32(a + "attention.head_count", static_cast<uint32_t>(s.n_head))
      .U32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv))
      .U32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim))
      .U32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim))
      .F32(a + "rope.freq_base", s.rope_freq_base)
      .F32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  if (s.n_expert > 0) {
    w.U32(a + "expert_count", static_cast<uint32_t>(s.n_expert))
        .U32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used))
        .U32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp))
        .F32("tierkv.make_model.router_skew", static_cast<float>(o.skew));
  }
  if (vocab) {
    for (const GgufKv& kv : vocab->metadata()) {
      if (kv.key.rfind("tokenizer.", 0) == 0) w.Value(kv.key, kv.value);
    }
  } else {
    w.String("tokenizer.ggml.model", "none");
  }

  const Shape shape{s, n_layer, n_vocab};
  out.plans = PlanTensors(shape, o.type);
  std::map<std::string, uint64_t> by_type;
  for (const Plan& p : out.plans) {
    w.StreamedTensor(p.name, p.type, p.ne);
    uint64_t bytes = GgmlRowBytes(*FindGgmlType(p.type), p.ne[0]);
    for (size_t d = 1; d < p.ne.size(); ++d) bytes *= p.ne[d];
    by_type[FindGgmlType(p.type)->name] += bytes;
  }
  out.report.file_bytes = w.ImageBytes();
  out.report.tensors = out.plans.size();
  out.report.layers = n_layer;
  out.report.n_vocab = n_vocab;
  out.report.bytes_by_type.assign(by_type.begin(), by_type.end());
  return out;
}

}  // namespace

Result<MakeModelReport> PlanMakeModel(const MakeModelOptions& o, std::vector<MakeModelTensor>* tensors) {
  TIERKV_ASSIGN_OR_RETURN(Prepared p, Prepare(o));
  if (tensors) {
    tensors->clear();
    for (const Plan& t : p.plans) tensors->push_back({t.name, FindGgmlType(t.type)->name, t.ne});
  }
  return p.report;
}

Status MakeModel(const MakeModelOptions& o, MakeModelReport* report) {
  if (o.out.empty()) return Status::InvalidArgument("-o/--output is required");
  TIERKV_ASSIGN_OR_RETURN(Prepared prepared, Prepare(o));
  const MakeModelShape& s = *prepared.shape;
  const std::vector<Plan>& plans = prepared.plans;

  // Each tensor's values come from its own generator (seed, index), drawn in order, so
  // the file does not depend on how WriteFile cuts tensors into chunks.
  std::unique_ptr<SplitMix64> rng;
  std::vector<float> gains;
  std::vector<float> values;
  const auto fill = [&](size_t index, uint64_t offset, std::span<uint8_t> out) -> Status {
    const Plan& p = plans[index];
    if (offset == 0) {
      rng = std::make_unique<SplitMix64>(o.seed * 0xD1B54A32D192ED03ull + index);
      if (p.kind == Plan::Kind::kRouter) gains = RouterGains(o.seed, p.layer, s.n_expert, o.skew);
    }
    const float sigma = 1.0f / std::sqrt(static_cast<float>(p.ne[0]));
    if (p.type != GT::kF32) {
      RandomBlocks(p.type, *rng, sigma, out.data(), out.size() / FindGgmlType(p.type)->block_bytes);
      return Status::Ok();
    }
    values.resize(out.size() / 4);
    const uint64_t first = offset / 4;
    for (size_t i = 0; i < values.size(); ++i) {
      if (p.kind == Plan::Kind::kNorm) {
        values[i] = 1.0f + 0.1f * static_cast<float>(2.0 * rng->Uniform() - 1.0);
      } else {  // router row r = (first + i) / n_embd
        const uint64_t row = (first + i) / p.ne[0];
        values[i] = gains[row] * sigma * static_cast<float>(rng->Normal());
      }
    }
    std::memcpy(out.data(), values.data(), out.size());
    return Status::Ok();
  };
  TIERKV_RETURN_IF_ERROR(prepared.w.WriteFile(o.out, fill, o.progress));
  if (report) *report = prepared.report;
  return Status::Ok();
}

}  // namespace tierkv
