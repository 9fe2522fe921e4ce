// runtime/model.cc
//
// Loading: the config, the RoPE parameters (with scaling overrides), and the weights as
// views into the GGUF mapping, each checked for type and shape with a message naming the
// tensor.
#include "runtime/model.h"

#include <cmath>
#include <cstring>

#include "runtime/model_internal.h"

namespace tierkv {
namespace {

using kernels::MatrixView;
using kernels::WeightType;

std::string Shape(const GgufTensor& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < std::max<uint32_t>(t.n_dims, 1); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

}  // namespace

// Typed, shape-checked access to the tensors of one file.
class TensorBinder {
 public:
  explicit TensorBinder(const GgufFile& f) : f_(f) {}

  // A weight matrix of `rows` rows of `cols` values (times `experts` stacked, if > 0).
  Result<MatrixView> Matrix(const std::string& name, int64_t cols, int64_t rows, int64_t experts = 0) const {
    const GgufTensor* t = f_.FindTensor(name);
    if (t == nullptr) return Status::InvalidArgument("model: tensor " + name + " is missing");
    const kernels::WeightTypeInfo* info = kernels::FindWeightType(static_cast<uint32_t>(t->type));
    if (info == nullptr || kernels::IsActivationOnly(info->type)) {
      return Status::Unsupported("model: tensor " + name + " has type " + GgmlTypeName(t->type) +
                                 ", which the CPU kernels cannot read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                                 "Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
    }
    const int64_t want_experts = experts > 0 ? experts : 1;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != want_experts || t->ne[3] != 1) {
      std::string want = "[";
      want += std::to_string(cols);
      want += ", ";
      want += std::to_string(rows);
      if (experts > 0) want += ", " + std::to_string(experts);
      return Status::InvalidArgument("model: tensor " + name + " has shape " + Shape(*t) + ", expected " + want + "]");
    }
    // The kernels read weights through their block structs: F32 rows need 4-byte
    // alignment, every other type 2-byte (its fp16 scales). GGUF's alignment (32 by
    // default) gives that; a general.alignment of 1 or 2 may not.
    const uintptr_t align = info->type == WeightType::kF32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(t->data) % align != 0) {
      return Status::InvalidArgument("model: tensor " + name + " (" + GgmlTypeName(t->type) + ") at file offset " +
                                     std::to_string(t->file_offset) + " is not " + std::to_string(align) +
                                     "-byte aligned (general.alignment = " + std::to_string(f_.alignment()) + ")");
    }
    MatrixView m;
    m.type = info->type;
    m.data = t->data;
    m.cols = cols;
    m.rows = rows;
    m.row_bytes = kernels::RowBytes(info->type, cols);
    return m;
  }

  // A vector of n f32 values (norm weights, biases). F16/BF16 ones are converted into
  // `storage`, which must outlive the pointer.
  Result<const float*> Vector(const std::string& name, int64_t n, std::vector<std::vector<float>>* storage) const {
    const GgufTensor* t = f_.FindTensor(name);
    if (t == nullptr) return Status::InvalidArgument("model: tensor " + name + " is missing");
    if (t->n_elements != static_cast<uint64_t>(n) || t->ne[0] != n) {
      return Status::InvalidArgument("model: tensor " + name + " has shape " + Shape(*t) + ", expected [" +
                                     std::to_string(n) + "]");
    }
    if (t->type == GgmlType::kF32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0) {
      return reinterpret_cast<const float*>(t->data);
    }
    const kernels::WeightTypeInfo* info = kernels::FindWeightType(static_cast<uint32_t>(t->type));
    if (info == nullptr || n % info->block_size != 0 || kernels::IsActivationOnly(info->type)) {
      return Status::Unsupported("model: tensor " + name + " has unsupported type " + GgmlTypeName(t->type));
    }
    storage->emplace_back(static_cast<size_t>(n));
    const void* src = t->data;
    std::vector<uint8_t> aligned;  // F16 / BF16 / blocks placed off their 2-byte alignment
    if (reinterpret_cast<uintptr_t>(src) % 2 != 0) {
      aligned.assign(t->data, t->data + t->n_bytes);
      src = aligned.data();
    }
    kernels::DequantizeRow(info->type, src, storage->back().data(), n);
    return static_cast<const float*>(storage->back().data());
  }

  bool Has(const std::string& name) const { return f_.FindTensor(name) != nullptr; }

 private:
  const GgufFile& f_;
};

Model::Model(std::shared_ptr<const GgufFile> file, ModelConfig cfg, ModelOptions options)
    : file_(std::move(file)), cfg_(std::move(cfg)), options_(options) {}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::Load(std::shared_ptr<const GgufFile> file, const ModelOptions& options) {
  if (file == nullptr) return Status::InvalidArgument("model: no GGUF file");
  TIERKV_ASSIGN_OR_RETURN(ModelConfig cfg, ReadModelConfig(*file));
  if (options.threads < 0) return Status::InvalidArgument("model: threads must be >= 0");
  if (options.kv_batch_blocks < 0) return Status::InvalidArgument("model: kv_batch_blocks must be >= 0");
  if (cfg.head_dim > kMaxCodecHeadDim) {
    return Status::Unsupported("model: head_dim " + std::to_string(cfg.head_dim) + " exceeds the KV codecs' limit");
  }

  TIERKV_RETURN_IF_ERROR(ApplyRopeOverrides(options.rope, options.n_ctx, &cfg));

  std::unique_ptr<Model> m(new Model(std::move(file), std::move(cfg), options));
  const ModelConfig& c = m->cfg_;
  kernels::RopeParams& rp = m->rope_;
  rp.n_dims = c.rope_dims;
  rp.mode = c.rope_mode;
  rp.freq_base = c.rope_freq_base;
  rp.freq_scale = 1.0f / c.rope_scale_factor;
  rp.ext_factor = c.rope_scaling == RopeScaling::kYarn ? 1.0f : 0.0f;
  rp.attn_factor = c.rope_scaling == RopeScaling::kYarn ? c.yarn_attn_factor : 1.0f;
  rp.beta_fast = c.yarn_beta_fast;
  rp.beta_slow = c.yarn_beta_slow;
  rp.n_ctx_orig = c.rope_orig_ctx;
  m->exec_ = options.executor != nullptr ? options.executor : kernels::MakeCpuExecutor(options.threads);
  if (Status st = m->BindWeights(); !st.ok()) {
    return m->file_->path().empty() ? st : st.Annotate(m->file_->path());  // which file lacks the tensor
  }
  // Only now, with every size matched by a bound tensor.
  m->s_ = std::make_unique<Scratch>(c, m->exec_.get());
  return m;
}

Status Model::BindWeights() {
  const ModelConfig& c = cfg_;
  const TensorBinder b(*file_);
  w_ = std::make_unique<Weights>();
  Weights& w = *w_;
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;

  TIERKV_ASSIGN_OR_RETURN(w.token_embd, b.Matrix("token_embd.weight", c.n_embd, c.n_vocab));
  TIERKV_ASSIGN_OR_RETURN(w.output_norm, b.Vector("output_norm.weight", c.n_embd, &w.owned));
  if (c.tied_output) {
    w.output = w.token_embd;
  } else {
    TIERKV_ASSIGN_OR_RETURN(w.output, b.Matrix("output.weight", c.n_embd, c.n_vocab));
  }
  if (b.Has("rope_freqs.weight")) {
    TIERKV_ASSIGN_OR_RETURN(rope_.freq_factors, b.Vector("rope_freqs.weight", c.rope_dims / 2, &w.owned));
  }

  // n_layer is the number of blk.N layers the file has (ReadModelConfig): at most one
  // Layer per tensor.
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    Layer& L = w.layers[static_cast<size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    TIERKV_ASSIGN_OR_RETURN(L.attn_norm, b.Vector(p + "attn_norm.weight", c.n_embd, &w.owned));
    TIERKV_ASSIGN_OR_RETURN(L.wq, b.Matrix(p + "attn_q.weight", c.n_embd, q_dim));
    TIERKV_ASSIGN_OR_RETURN(L.wk, b.Matrix(p + "attn_k.weight", c.n_embd, kv_dim));
    TIERKV_ASSIGN_OR_RETURN(L.wv, b.Matrix(p + "attn_v.weight", c.n_embd, kv_dim));
    TIERKV_ASSIGN_OR_RETURN(L.wo, b.Matrix(p + "attn_output.weight", q_dim, c.n_embd));
    if (c.qkv_bias) {
      TIERKV_ASSIGN_OR_RETURN(L.bq, b.Vector(p + "attn_q.bias", q_dim, &w.owned));
      TIERKV_ASSIGN_OR_RETURN(L.bk, b.Vector(p + "attn_k.bias", kv_dim, &w.owned));
      TIERKV_ASSIGN_OR_RETURN(L.bv, b.Vector(p + "attn_v.bias", kv_dim, &w.owned));
    }
    if (c.qk_norm) {
      TIERKV_ASSIGN_OR_RETURN(L.q_norm, b.Vector(p + "attn_q_norm.weight", c.head_dim, &w.owned));
      TIERKV_ASSIGN_OR_RETURN(L.k_norm, b.Vector(p + "attn_k_norm.weight", c.head_dim, &w.owned));
    }
    TIERKV_ASSIGN_OR_RETURN(L.ffn_norm, b.Vector(p + "ffn_norm.weight", c.n_embd, &w.owned));
    if (c.is_moe()) {
      TIERKV_ASSIGN_OR_RETURN(L.gate_inp, b.Matrix(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert));
      TIERKV_ASSIGN_OR_RETURN(L.gate_exps, b.Matrix(p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert));
      TIERKV_ASSIGN_OR_RETURN(L.up_exps, b.Matrix(p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert));
      TIERKV_ASSIGN_OR_RETURN(L.down_exps, b.Matrix(p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert));
    } else {
      TIERKV_ASSIGN_OR_RETURN(L.gate, b.Matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff));
      TIERKV_ASSIGN_OR_RETURN(L.up, b.Matrix(p + "ffn_up.weight", c.n_embd, c.n_ff));
      TIERKV_ASSIGN_OR_RETURN(L.down, b.Matrix(p + "ffn_down.weight", c.n_ff, c.n_embd));
    }
  }
  return Status::Ok();
}

KvGeometry Model::KvGeometryFor(KvCodec codec, int block_tokens) const {
  KvGeometry g;
  g.n_layers = cfg_.n_layer;
  g.n_kv_heads = cfg_.n_head_kv;
  g.head_dim = cfg_.head_dim;
  g.block_tokens = block_tokens;
  g.codec = codec;
  return g;
}

}  // namespace tierkv
