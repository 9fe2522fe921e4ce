// runtime/model_config.cc
//
// ModelConfig from GGUF metadata: the keys llama.cpp writes for llama, qwen2, qwen3 and
// qwen3moe, with llama.cpp's defaults for the optional ones.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "runtime/model.h"

namespace tierkv {
namespace {

struct Reader {
  const GgufFile& f;
  std::string prefix;  // "<arch>."

  template <GgufNumber T>
  Result<T> Get(const std::string& key) const {
    return f.Get<T>(prefix + key);
  }
  template <GgufNumber T>
  Result<T> Get(const std::string& key, T fallback) const {
    auto v = f.GetOptional<T>(prefix + key);
    if (!v.ok()) return v.status();
    return v->has_value() ? **v : fallback;
  }
};

Status Bad(const std::string& what) { return Status::InvalidArgument("model config: " + what); }

}  // namespace

const char* ModelArchName(ModelArch arch) {
  switch (arch) {
    case ModelArch::kLlama: return "llama";
    case ModelArch::kQwen2: return "qwen2";
    case ModelArch::kQwen3: return "qwen3";
    case ModelArch::kQwen3Moe: return "qwen3moe";
  }
  return "unknown";
}

const char* RopeScalingName(RopeScaling s) {
  switch (s) {
    case RopeScaling::kNone: return "none";
    case RopeScaling::kLinear: return "linear";
    case RopeScaling::kYarn: return "yarn";
  }
  return "unknown";
}

std::string ModelConfig::ToString() const {
  std::ostringstream o;
  o << ModelArchName(arch) << ": vocab " << n_vocab << ", embd " << n_embd << ", layers " << n_layer << ", heads "
    << n_head << "/" << n_head_kv << " x " << head_dim;
  if (is_moe()) {
    o << ", experts " << n_expert_used << " of " << n_expert << " (ffn " << n_ff_exp << ")";
  } else {
    o << ", ffn " << n_ff;
  }
  o << ", rope " << (rope_mode == kernels::RopeMode::kNorm ? "norm" : "neox") << " base " << rope_freq_base;
  if (rope_scaling != RopeScaling::kNone) o << " " << RopeScalingName(rope_scaling) << " x" << rope_scale_factor;
  if (rope_scaling == RopeScaling::kYarn) o << " from " << rope_orig_ctx;
  o << ", ctx " << context_length << ", eps " << rms_eps;
  if (qk_norm) o << ", qk-norm";
  if (qkv_bias) o << ", qkv-bias";
  if (tied_output) o << ", tied output";
  return o.str();
}

namespace {
Result<ModelConfig> ReadConfig(const GgufFile& file) {
  ModelConfig c;
  const std::string_view arch = file.architecture();
  if (arch == "llama") {
    c.arch = ModelArch::kLlama;
  } else if (arch == "qwen2") {
    c.arch = ModelArch::kQwen2;
  } else if (arch == "qwen3") {
    c.arch = ModelArch::kQwen3;
  } else if (arch == "qwen3moe") {
    c.arch = ModelArch::kQwen3Moe;
  } else {
    return Status::Unsupported("model config: architecture '" + std::string(arch) +
                               "' is not supported (llama, qwen2, qwen3, qwen3moe)");
  }
  const Reader r{file, std::string(arch) + "."};

  TIERKV_ASSIGN_OR_RETURN(c.n_embd, r.Get<int32_t>("embedding_length"));
  TIERKV_ASSIGN_OR_RETURN(c.n_layer, r.Get<int32_t>("block_count"));
  TIERKV_ASSIGN_OR_RETURN(c.n_head, r.Get<int32_t>("attention.head_count"));
  TIERKV_ASSIGN_OR_RETURN(c.n_head_kv, r.Get<int32_t>("attention.head_count_kv", c.n_head));
  TIERKV_ASSIGN_OR_RETURN(c.context_length, r.Get<int32_t>("context_length"));
  TIERKV_ASSIGN_OR_RETURN(c.rms_eps, r.Get<float>("attention.layer_norm_rms_epsilon"));
  if (!(c.rms_eps > 0.0f) || !std::isfinite(c.rms_eps)) {
    return Bad("attention.layer_norm_rms_epsilon must be a positive number, not " + std::to_string(c.rms_eps));
  }
  if (c.n_embd <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_head_kv <= 0) {
    return Bad("embedding_length, block_count and head counts must be positive");
  }
  if (c.n_head % c.n_head_kv != 0) {
    return Bad("head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
               std::to_string(c.n_head_kv));
  }
  TIERKV_ASSIGN_OR_RETURN(c.head_dim, r.Get<int32_t>("attention.key_length", c.n_embd / c.n_head));
  TIERKV_ASSIGN_OR_RETURN(const int32_t v_len, r.Get<int32_t>("attention.value_length", c.head_dim));
  if (c.head_dim <= 0 || v_len != c.head_dim) {
    return Status::Unsupported("model config: key_length " + std::to_string(c.head_dim) + " and value_length " +
                               std::to_string(v_len) + " must be equal and positive");
  }

  c.rope_mode = c.arch == ModelArch::kLlama ? kernels::RopeMode::kNorm : kernels::RopeMode::kNeox;
  TIERKV_ASSIGN_OR_RETURN(c.rope_dims, r.Get<int32_t>("rope.dimension_count", c.head_dim));
  TIERKV_ASSIGN_OR_RETURN(c.rope_freq_base, r.Get<float>("rope.freq_base", 10000.0f));
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    return Bad("rope.dimension_count " + std::to_string(c.rope_dims) + " must be even and within head_dim " +
               std::to_string(c.head_dim));
  }
  if (!(c.rope_freq_base > 0.0f) || !std::isfinite(c.rope_freq_base)) {
    return Bad("rope.freq_base must be a positive number, not " + std::to_string(c.rope_freq_base));
  }

  // Rope scaling (llama.cpp's keys; rope.scale_linear is the older spelling of linear).
  const GgufValue* type = file.Find(std::string(arch) + ".rope.scaling.type");
  if (type != nullptr) {
    TIERKV_ASSIGN_OR_RETURN(const std::string_view t, type->AsString());
    if (t == "none") {
      c.rope_scaling = RopeScaling::kNone;
    } else if (t == "linear") {
      c.rope_scaling = RopeScaling::kLinear;
    } else if (t == "yarn") {
      c.rope_scaling = RopeScaling::kYarn;
    } else {
      return Status::Unsupported("model config: rope scaling type '" + std::string(t) + "' is not supported");
    }
  }
  TIERKV_ASSIGN_OR_RETURN(const float linear, r.Get<float>("rope.scale_linear", 0.0f));
  TIERKV_ASSIGN_OR_RETURN(c.rope_scale_factor, r.Get<float>("rope.scaling.factor", linear));
  if (type == nullptr && linear > 0.0f) c.rope_scaling = RopeScaling::kLinear;
  if (c.rope_scale_factor == 0.0f || c.rope_scaling == RopeScaling::kNone) c.rope_scale_factor = 1.0f;
  if (!(c.rope_scale_factor >= 1.0f)) return Bad("rope scaling factor must be >= 1");
  TIERKV_ASSIGN_OR_RETURN(c.rope_orig_ctx, r.Get<int32_t>("rope.scaling.original_context_length", c.context_length));
  TIERKV_ASSIGN_OR_RETURN(c.yarn_attn_factor, r.Get<float>("rope.scaling.attn_factor", 1.0f));
  TIERKV_ASSIGN_OR_RETURN(c.yarn_beta_fast, r.Get<float>("rope.scaling.yarn_beta_fast", 32.0f));
  TIERKV_ASSIGN_OR_RETURN(c.yarn_beta_slow, r.Get<float>("rope.scaling.yarn_beta_slow", 1.0f));

  if (c.arch == ModelArch::kQwen3Moe) {
    TIERKV_ASSIGN_OR_RETURN(c.n_expert, r.Get<int32_t>("expert_count"));
    TIERKV_ASSIGN_OR_RETURN(c.n_expert_used, r.Get<int32_t>("expert_used_count"));
    TIERKV_ASSIGN_OR_RETURN(c.n_ff_exp, r.Get<int32_t>("expert_feed_forward_length"));
    TIERKV_ASSIGN_OR_RETURN(c.norm_topk_prob, r.Get<bool>("expert_weights_norm", true));
    if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert || c.n_ff_exp <= 0) {
      return Bad("expert_count, expert_used_count and expert_feed_forward_length must be positive, used <= count");
    }
    TIERKV_ASSIGN_OR_RETURN(c.n_ff, r.Get<int32_t>("feed_forward_length", 0));
  } else {
    TIERKV_ASSIGN_OR_RETURN(c.n_ff, r.Get<int32_t>("feed_forward_length"));
    if (c.n_ff <= 0) return Bad("feed_forward_length must be positive");
  }
  c.qk_norm = c.arch == ModelArch::kQwen3 || c.arch == ModelArch::kQwen3Moe;
  c.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.tied_output = file.FindTensor("output.weight") == nullptr;

  const GgufTensor* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return Bad("tensor token_embd.weight is missing");
  if (embd->ne[0] != c.n_embd) {
    return Bad("token_embd.weight rows have " + std::to_string(embd->ne[0]) + " values, embedding_length is " +
               std::to_string(c.n_embd));
  }
  c.n_vocab = static_cast<int>(embd->ne[1]);
  return c;
}
}  // namespace

// Errors name the file (builtin models have none: their name).
Result<ModelConfig> ReadModelConfig(const GgufFile& file) {
  auto c = ReadConfig(file);
  if (!c.ok() && !file.path().empty()) return c.status().Annotate(file.path());
  return c;
}

Status ApplyRopeOverrides(const RopeOverrides& o, int n_ctx, ModelConfig* c) {
  const auto bad = [](const std::string& what) { return Status::InvalidArgument("RoPE: " + what); };
  if (o.freq_base < 0.0f || !std::isfinite(o.freq_base)) return bad("--rope-freq-base must be positive");
  if (o.orig_ctx < 0) return bad("--yarn-orig-ctx must not be negative");
  for (const float v : {o.yarn_attn_factor, o.yarn_beta_fast, o.yarn_beta_slow}) {
    if (v < 0.0f || !std::isfinite(v)) return bad("--yarn-attn-factor, --yarn-beta-fast and --yarn-beta-slow must be positive");
  }
  if (o.freq_base > 0.0f) c->rope_freq_base = o.freq_base;
  if (o.scaling.has_value() || o.scale_factor != 0.0f) {
    const RopeScaling file_type = c->rope_scaling;
    if (o.scaling.has_value()) {
      c->rope_scaling = *o.scaling;
    } else if (c->rope_scaling == RopeScaling::kNone) {
      c->rope_scaling = RopeScaling::kLinear;
    }
    float factor = o.scale_factor;
    if (c->rope_scaling == RopeScaling::kNone) {
      factor = 1.0f;
    } else if (factor == 0.0f) {
      if (file_type == c->rope_scaling && c->rope_scale_factor > 1.0f) {
        factor = c->rope_scale_factor;
      } else {
        const int ctx = n_ctx > 0 ? n_ctx : c->context_length;
        factor = std::max(1.0f, static_cast<float>(ctx) / static_cast<float>(c->context_length));
      }
    }
    if (!(factor >= 1.0f) || !std::isfinite(factor)) {
      return bad("the scale factor (--rope-scale) must be >= 1 (--rope-freq-scale <= 1)");
    }
    c->rope_scale_factor = factor;
  }
  if (o.orig_ctx > 0) c->rope_orig_ctx = o.orig_ctx;
  if (c->rope_orig_ctx <= 0) c->rope_orig_ctx = c->context_length;
  if (o.yarn_attn_factor > 0.0f) c->yarn_attn_factor *= o.yarn_attn_factor;
  if (o.yarn_beta_fast > 0.0f) c->yarn_beta_fast = o.yarn_beta_fast;
  if (o.yarn_beta_slow > 0.0f) c->yarn_beta_slow = o.yarn_beta_slow;
  return Status::Ok();
}

}  // namespace tierkv
