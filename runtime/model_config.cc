// runtime/model_config.cc
//
// ModelConfig from GGUF metadata: the keys llama.cpp writes for llama, qwen2, qwen3 and
// qwen3moe, with llama.cpp's defaults for the optional ones. Every size is checked
// against the tensors before anything is sized by it (docs/gguf.md, "Header sizes"):
// block_count against the blk.N layers present, embedding_length against token_embd,
// head counts and key/value lengths against attn_q/k/v/output, feed_forward_length
// against the dense FFN tensors, expert counts against the expert tensors. Errors name
// the key, its value and the tensor it disagrees with.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/model.h"

namespace tierkv {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

Status Bad(const std::string& what) { return Status::InvalidArgument("model config: " + what); }

std::string Shape(const GgufTensor& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < std::max<uint32_t>(t.n_dims, 1); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

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

  // An integer key within [lo, hi] (hi <= INT32_MAX), read from any integer type; a
  // missing key is `fallback`, or kNotFound without one. Values out of range, u64
  // ones past INT64_MAX included, are refused naming the key and the value.
  Result<int> Int(const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t> fallback = {}) const {
    const std::string name = prefix + key;
    const GgufValue* v = f.Find(name);
    if (v == nullptr) {
      if (fallback.has_value()) return static_cast<int>(*fallback);
      return f.Get<int64_t>(name).status();  // gguf: key '...' not found
    }
    bool too_big = false;
    int64_t value = 0;
    if (auto u = v->As<uint64_t>(); u.ok()) {
      too_big = *u > static_cast<uint64_t>(hi);
      value = too_big ? hi : static_cast<int64_t>(*u);
    } else {
      auto i = v->As<int64_t>();
      if (!i.ok()) return i.status().Annotate("gguf: key '" + name + "'");
      value = *i;
      too_big = value > hi;
    }
    const std::string is = name + " = " + FormatGgufValue(*v);
    if (too_big) {
      return Bad(is + (hi == kIntMax ? " is more than 2147483647 (the largest an int holds)"
                                     : " is more than " + std::to_string(hi)));
    }
    if (value < lo) return Bad(is + (lo == 1 ? " must be positive" : " must be at least " + std::to_string(lo)));
    return static_cast<int>(value);
  }
};

// The layers the tensors describe: the distinct N of the "blk.N." tensor names
// (N in canonical decimal), ascending. At most one entry per tensor.
std::vector<uint64_t> LayerIndices(const GgufFile& f) {
  std::vector<uint64_t> layers;
  for (const GgufTensor& t : f.tensors()) {
    const std::string_view name = t.name;
    if (!name.starts_with("blk.")) continue;
    const std::string_view rest = name.substr(4);
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos || dot == 0 || (dot > 1 && rest[0] == '0')) continue;
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, n);
    if (ec != std::errc() || end != rest.data() + dot) n = std::numeric_limits<uint64_t>::max();  // huge
    layers.push_back(n);
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

// block_count = the number of layers present, numbered blk.0 .. blk.(block_count - 1).
Status CheckLayerCount(const GgufFile& f, const std::string& key, int n_layer) {
  const std::vector<uint64_t> layers = LayerIndices(f);
  const std::string is = key + " = " + std::to_string(n_layer);
  if (layers.empty()) return Bad(is + " but the file has no layer tensors (blk.N.*)");
  const uint64_t last = layers.back();
  const std::string last_name =
      last == std::numeric_limits<uint64_t>::max() ? "a number past 2^64" : std::to_string(last);
  if (layers.size() != static_cast<size_t>(n_layer)) {
    std::string what = is + " but the file has tensors for " + std::to_string(layers.size()) +
                       (layers.size() == 1 ? " layer" : " layers");
    if (last + 1 != layers.size()) what += " (numbered up to blk." + last_name + ")";
    return Bad(what);
  }
  if (last + 1 != layers.size()) {
    return Bad(is + " but the file's layer tensors are numbered up to blk." + last_name + " (not blk.0 .. blk." +
               std::to_string(n_layer - 1) + ")");
  }
  return Status::Ok();
}

// Dimension `dim` of `tensor`, where the file has it, must be `want`, the size `what`
// gives ("qwen3moe.feed_forward_length = 6144"). A missing tensor is left to the
// weight binding (Model::Load), which names it.
Status MatchTensor(const GgufFile& f, const std::string& tensor, int dim, int64_t want, const std::string& what) {
  const GgufTensor* t = f.FindTensor(tensor);
  if (t == nullptr || t->ne[static_cast<size_t>(dim)] == want) return Status::Ok();
  return Bad(what + " does not match " + tensor + " (" + Shape(*t) + ")");
}

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
  const std::string a = std::string(arch) + ".";
  const Reader r{file, a};
  // "qwen3moe.block_count = 2", for messages.
  const auto is = [&](const std::string& key, int64_t v) { return a + key + " = " + std::to_string(v); };

  // The counts, each within [1, INT32_MAX] (context_length is only a default, for -c
  // and RoPE scaling: bounded, not matched), then checked against the tensors.
  TIERKV_ASSIGN_OR_RETURN(c.n_embd, r.Int("embedding_length", 1, kIntMax));
  TIERKV_ASSIGN_OR_RETURN(c.n_layer, r.Int("block_count", 1, kIntMax));
  TIERKV_ASSIGN_OR_RETURN(c.n_head, r.Int("attention.head_count", 1, kIntMax));
  TIERKV_ASSIGN_OR_RETURN(c.n_head_kv, r.Int("attention.head_count_kv", 1, kIntMax, c.n_head));
  TIERKV_ASSIGN_OR_RETURN(c.context_length, r.Int("context_length", 1, kIntMax));
  TIERKV_ASSIGN_OR_RETURN(c.rms_eps, r.Get<float>("attention.layer_norm_rms_epsilon"));
  if (!(c.rms_eps > 0.0f) || !std::isfinite(c.rms_eps)) {
    return Bad(a + "attention.layer_norm_rms_epsilon must be a positive number, not " + std::to_string(c.rms_eps));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return Bad(is("attention.head_count", c.n_head) + " is not a multiple of " +
               is("attention.head_count_kv", c.n_head_kv));
  }
  const bool has_key_length = file.Has(a + "attention.key_length");
  if (!has_key_length && c.n_embd < c.n_head) {
    return Bad(is("attention.head_count", c.n_head) + " is more than embedding_length " + std::to_string(c.n_embd) +
               " and attention.key_length is missing (head_dim = embedding_length / head_count)");
  }
  TIERKV_ASSIGN_OR_RETURN(c.head_dim, r.Int("attention.key_length", 1, kIntMax, c.n_embd / c.n_head));
  TIERKV_ASSIGN_OR_RETURN(const int v_len, r.Int("attention.value_length", 1, kIntMax, c.head_dim));
  if (v_len != c.head_dim) {
    return Status::Unsupported("model config: " + is("attention.key_length", c.head_dim) + " and " +
                               is("attention.value_length", v_len) + " must be equal");
  }

  // Which FFN tensors the layers have: a MoE model's feed_forward_length sizes nothing
  // unless a layer has dense FFN tensors for it to match.
  bool dense_ffn = false;
  TIERKV_RETURN_IF_ERROR(CheckLayerCount(file, a + "block_count", c.n_layer));  // n_layer <= n_tensors from here
  for (int l = 0; l < c.n_layer && !dense_ffn; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    dense_ffn = file.FindTensor(p + "ffn_gate.weight") != nullptr || file.FindTensor(p + "ffn_up.weight") != nullptr ||
                file.FindTensor(p + "ffn_down.weight") != nullptr;
  }
  if (c.arch == ModelArch::kQwen3Moe) {
    TIERKV_ASSIGN_OR_RETURN(c.n_expert, r.Int("expert_count", 1, kIntMax));
    TIERKV_ASSIGN_OR_RETURN(c.n_expert_used, r.Int("expert_used_count", 1, kIntMax));
    TIERKV_ASSIGN_OR_RETURN(c.n_ff_exp, r.Int("expert_feed_forward_length", 1, kIntMax));
    TIERKV_ASSIGN_OR_RETURN(c.norm_topk_prob, r.Get<bool>("expert_weights_norm", true));
    if (c.n_expert_used > c.n_expert) {
      return Bad(is("expert_used_count", c.n_expert_used) + " is more than " + is("expert_count", c.n_expert));
    }
    if (static_cast<int64_t>(c.n_expert) * c.n_layer > kIntMax) {
      return Bad(is("expert_count", c.n_expert) + " times block_count " + std::to_string(c.n_layer) +
                 " is more than 2147483647 experts");
    }
    if (dense_ffn) {
      TIERKV_ASSIGN_OR_RETURN(c.n_ff, r.Int("feed_forward_length", 1, kIntMax));
    }
  } else {
    TIERKV_ASSIGN_OR_RETURN(c.n_ff, r.Int("feed_forward_length", 1, kIntMax));
  }
  c.qk_norm = c.arch == ModelArch::kQwen3 || c.arch == ModelArch::kQwen3Moe;
  c.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.tied_output = file.FindTensor("output.weight") == nullptr;

  // The sizes against the tensors, before anything is sized by them.
  const GgufTensor* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return Bad("tensor token_embd.weight is missing");
  TIERKV_RETURN_IF_ERROR(MatchTensor(file, "token_embd.weight", 0, c.n_embd, is("embedding_length", c.n_embd)));
  if (embd->ne[1] < 1 || embd->ne[1] > kIntMax || embd->ne[2] != 1 || embd->ne[3] != 1) {
    return Bad("tensor token_embd.weight has shape " + Shape(*embd) + ", expected [" + std::to_string(c.n_embd) +
               ", n_vocab] with 1 <= n_vocab <= 2147483647");
  }
  c.n_vocab = static_cast<int>(embd->ne[1]);
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  const std::string kl = has_key_length ? "key_length" : "head_dim (embedding_length / head_count)";
  const std::string q_is = is("attention.head_count", c.n_head) + " with " + kl + " " + std::to_string(c.head_dim);
  const std::string kv_is =
      is("attention.head_count_kv", c.n_head_kv) + " with " + kl + " " + std::to_string(c.head_dim);
  const std::string hd_is = has_key_length ? is("attention.key_length", c.head_dim)
                                           : a + "attention.head_count = " + std::to_string(c.n_head) + " (" + kl +
                                                 " " + std::to_string(c.head_dim) + ")";
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "attn_q.weight", 1, q_dim, q_is));
    TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "attn_k.weight", 1, kv_dim, kv_is));
    TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "attn_v.weight", 1, kv_dim, kv_is));
    TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "attn_output.weight", 0, q_dim, q_is));
    if (c.qk_norm) {
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "attn_q_norm.weight", 0, c.head_dim, hd_is));
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "attn_k_norm.weight", 0, c.head_dim, hd_is));
    }
    if (c.n_ff > 0) {
      const std::string ff = is("feed_forward_length", c.n_ff);
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_gate.weight", 1, c.n_ff, ff));
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_up.weight", 1, c.n_ff, ff));
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_down.weight", 0, c.n_ff, ff));
    }
    if (c.is_moe()) {
      const std::string ne = is("expert_count", c.n_expert), ff = is("expert_feed_forward_length", c.n_ff_exp);
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_gate_inp.weight", 1, c.n_expert, ne));
      for (const char* t : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
        TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + t, 2, c.n_expert, ne));
      }
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_gate_exps.weight", 1, c.n_ff_exp, ff));
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_up_exps.weight", 1, c.n_ff_exp, ff));
      TIERKV_RETURN_IF_ERROR(MatchTensor(file, p + "ffn_down_exps.weight", 0, c.n_ff_exp, ff));
    }
  }
  // Matched by tensors that lie in the file, these are bounded by its size; a vector of
  // one of them must still fit an int (the kernels' widths).
  if (q_dim > kIntMax || kv_dim > kIntMax) {
    return Bad(q_is + ": " + std::to_string(q_dim) + " query values per token is more than 2147483647");
  }

  // RoPE, once head_dim (its default width) is known to match the tensors.
  c.rope_mode = c.arch == ModelArch::kLlama ? kernels::RopeMode::kNorm : kernels::RopeMode::kNeox;
  TIERKV_ASSIGN_OR_RETURN(c.rope_dims, r.Int("rope.dimension_count", 1, kIntMax, c.head_dim));
  TIERKV_ASSIGN_OR_RETURN(c.rope_freq_base, r.Get<float>("rope.freq_base", 10000.0f));
  if (c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    return Bad(is("rope.dimension_count", c.rope_dims) + " must be even and within head_dim " +
               std::to_string(c.head_dim));
  }
  if (!(c.rope_freq_base > 0.0f) || !std::isfinite(c.rope_freq_base)) {
    return Bad(a + "rope.freq_base must be a positive number, not " + std::to_string(c.rope_freq_base));
  }

  // Rope scaling (llama.cpp's keys; rope.scale_linear is the older spelling of linear).
  const GgufValue* type = file.Find(a + "rope.scaling.type");
  if (type != nullptr) {
    auto t = type->AsString();
    if (!t.ok()) return t.status().Annotate("gguf: key '" + a + "rope.scaling.type'");
    if (*t == "none") {
      c.rope_scaling = RopeScaling::kNone;
    } else if (*t == "linear") {
      c.rope_scaling = RopeScaling::kLinear;
    } else if (*t == "yarn") {
      c.rope_scaling = RopeScaling::kYarn;
    } else {
      return Status::Unsupported("model config: rope scaling type '" + EscapeGgufString(*t) + "' is not supported");
    }
  }
  TIERKV_ASSIGN_OR_RETURN(const float linear, r.Get<float>("rope.scale_linear", 0.0f));
  TIERKV_ASSIGN_OR_RETURN(c.rope_scale_factor, r.Get<float>("rope.scaling.factor", linear));
  if (type == nullptr && linear > 0.0f) c.rope_scaling = RopeScaling::kLinear;
  if (c.rope_scale_factor == 0.0f || c.rope_scaling == RopeScaling::kNone) c.rope_scale_factor = 1.0f;
  if (!(c.rope_scale_factor >= 1.0f)) {
    return Bad(a + "rope.scaling.factor (or rope.scale_linear) = " + FormatGgufFloat(c.rope_scale_factor) +
               " must be >= 1");
  }
  // 0: the trained context (ApplyRopeOverrides).
  TIERKV_ASSIGN_OR_RETURN(c.rope_orig_ctx,
                          r.Int("rope.scaling.original_context_length", 0, kIntMax, c.context_length));
  TIERKV_ASSIGN_OR_RETURN(c.yarn_attn_factor, r.Get<float>("rope.scaling.attn_factor", 1.0f));
  TIERKV_ASSIGN_OR_RETURN(c.yarn_beta_fast, r.Get<float>("rope.scaling.yarn_beta_fast", 32.0f));
  TIERKV_ASSIGN_OR_RETURN(c.yarn_beta_slow, r.Get<float>("rope.scaling.yarn_beta_slow", 1.0f));
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
