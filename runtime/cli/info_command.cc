// runtime/cli/info_command.cc
#include "runtime/cli/info_command.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "memory/size.h"
#include "runtime/builtin_model.h"
#include "runtime/chat_template.h"
#include "runtime/cli/cli_checks.h"

namespace tierkv {
namespace {

// The tensors' bytes by type, largest first (ties by name): "the type mix".
struct TypeShare {
  std::string name;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double percent = 0;
};
std::vector<TypeShare> TypeMix(const GgufFile& file) {
  std::map<std::string, TypeShare> by;
  for (const GgufTensor& t : file.tensors()) {
    TypeShare& s = by[t.traits().name];
    s.name = t.traits().name;
    ++s.tensors;
    s.bytes += t.n_bytes;
  }
  std::vector<TypeShare> out;
  for (auto& [name, share] : by) {
    share.percent = file.tensor_bytes() > 0 ? 100.0 * static_cast<double>(share.bytes) / file.tensor_bytes() : 0.0;
    out.push_back(share);
  }
  std::stable_sort(out.begin(), out.end(), [](const TypeShare& a, const TypeShare& b) { return a.bytes > b.bytes; });
  return out;
}

using Json = nlohmann::ordered_json;

std::string ShapeString(const GgufTensor& t) {
  std::string out = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(t.ne[d]);
  }
  return out + "]";
}

// 24379648 -> "24.38 M".
std::string HumanCount(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof(buf), "%.2f B", n / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof(buf), "%.2f M", n / 1e6);
  else if (n >= 1000ull) std::snprintf(buf, sizeof(buf), "%.2f K", n / 1e3);
  else std::snprintf(buf, sizeof(buf), "%" PRIu64, n);
  return buf;
}

// 544 -> "544", 544.5 -> "544.5", 1/3 -> "0.33".
std::string TrimmedNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string PadRight(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string PadLeft(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

// A JSON number that prints the way the value reads in the file (an f32 1e-05 prints
// as 1e-05, not 9.999999747378752e-06).
Json ScalarJson(const GgufValue& v) {
  switch (v.type()) {
    case GgufValueType::kU8:
    case GgufValueType::kU16:
    case GgufValueType::kU32:
    case GgufValueType::kU64:
      return v.As<uint64_t>().value();
    case GgufValueType::kI8:
    case GgufValueType::kI16:
    case GgufValueType::kI32:
    case GgufValueType::kI64:
      return v.As<int64_t>().value();
    case GgufValueType::kF32: {
      const float f = v.As<float>().value();
      if (!std::isfinite(f)) return nullptr;  // JSON has no inf/nan
      return std::stod(FormatGgufFloat(f));
    }
    case GgufValueType::kF64: {
      const double d = v.As<double>().value();
      if (!std::isfinite(d)) return nullptr;
      return d;
    }
    case GgufValueType::kBool:
      return v.As<bool>().value();
    case GgufValueType::kString:
      return std::string(v.AsString().value());
    case GgufValueType::kArray:
      break;
  }
  return nullptr;
}

Json ElementJson(const GgufValue& v, uint64_t i) {
  switch (v.element_type()) {
    case GgufValueType::kU8:
    case GgufValueType::kU16:
    case GgufValueType::kU32:
    case GgufValueType::kU64:
      return v.ElementAs<uint64_t>(i).value();
    case GgufValueType::kI8:
    case GgufValueType::kI16:
    case GgufValueType::kI32:
    case GgufValueType::kI64:
      return v.ElementAs<int64_t>(i).value();
    case GgufValueType::kF32: {
      const float f = v.ElementAs<float>(i).value();
      if (!std::isfinite(f)) return nullptr;
      return std::stod(FormatGgufFloat(f));
    }
    case GgufValueType::kF64: {
      const double d = v.ElementAs<double>(i).value();
      if (!std::isfinite(d)) return nullptr;
      return d;
    }
    case GgufValueType::kBool:
      return v.ElementAs<bool>(i).value();
    case GgufValueType::kString:
      return std::string((v.AsStringArray().value())[i]);
    case GgufValueType::kArray:
      break;
  }
  return nullptr;
}

Json ValueJson(const GgufValue& v, size_t max_items) {
  Json j;
  if (!v.is_array()) {
    j["type"] = GgufValueTypeName(v.type());
    j["value"] = ScalarJson(v);
    return j;
  }
  j["type"] = "array";
  j["element_type"] = GgufValueTypeName(v.element_type());
  j["count"] = v.size();
  Json values = Json::array();
  const uint64_t shown = std::min<uint64_t>(v.size(), max_items);
  for (uint64_t i = 0; i < shown; ++i) values.push_back(ElementJson(v, i));
  j["values"] = std::move(values);
  j["truncated"] = shown < v.size();
  return j;
}

Result<uint64_t> GetCount(const GgufFile& file, const std::string& key) {
  return file.Get<uint64_t>(key);
}

}  // namespace

Result<KvCacheShape> ReadKvCacheShape(const GgufFile& file) {
  KvCacheShape s;
  s.arch = std::string(file.architecture());
  if (s.arch.empty()) return Status::NotFound("gguf: key 'general.architecture' not found");
  const std::string a = s.arch + ".";
  TIERKV_ASSIGN_OR_RETURN(s.n_layer, GetCount(file, a + "block_count"));
  if (s.n_layer == 0) return Status::InvalidArgument("gguf: " + a + "block_count is 0");

  // head_count and head_count_kv are scalars, or per-layer arrays in some models.
  const std::string head_key = a + "attention.head_count";
  const GgufValue* head = file.Find(head_key);
  if (head == nullptr) return Status::NotFound("gguf: key '" + head_key + "' not found");
  std::optional<uint64_t> n_head;  // only when it is one value for all layers
  if (!head->is_array()) {
    TIERKV_ASSIGN_OR_RETURN(n_head, GetCount(file, head_key));
  }
  const std::string kv_key = a + "attention.head_count_kv";
  const GgufValue* kv = file.Find(kv_key);
  const GgufValue* kv_source = kv != nullptr ? kv : head;
  const std::string& kv_source_key = kv != nullptr ? kv_key : head_key;
  if (kv_source->is_array()) {
    Result<std::vector<uint64_t>> per_layer = kv_source->AsArray<uint64_t>();
    if (!per_layer.ok()) return per_layer.status().Annotate("gguf: key '" + kv_source_key + "'");
    if (per_layer->size() != s.n_layer) {
      return Status::InvalidArgument("gguf: key '" + kv_source_key + "' has " +
                                     std::to_string(per_layer->size()) + " entries for " +
                                     std::to_string(s.n_layer) + " layers");
    }
    for (uint64_t h : *per_layer) {
      if (h > (1ull << 32)) return Status::InvalidArgument("gguf: key '" + kv_source_key + "' is out of range");
      s.kv_heads_all_layers += h;
    }
    s.n_head_kv = per_layer->front();
  } else {
    TIERKV_ASSIGN_OR_RETURN(s.n_head_kv, GetCount(file, kv_source_key));
    if (s.n_head_kv > (1ull << 32) || s.n_layer > (1ull << 32)) {
      return Status::InvalidArgument("gguf: " + kv_source_key + " or block_count out of range");
    }
    s.kv_heads_all_layers = s.n_layer * s.n_head_kv;
  }

  auto head_dim = [&](const std::string& key) -> Result<uint64_t> {
    TIERKV_ASSIGN_OR_RETURN(std::optional<uint64_t> v, file.GetOptional<uint64_t>(key));
    if (v.has_value()) return *v;
    if (!n_head.has_value() || *n_head == 0) {
      return Status::NotFound("gguf: key '" + key + "' not found, and " + head_key +
                              " is not one nonzero value to derive it from");
    }
    TIERKV_ASSIGN_OR_RETURN(uint64_t n_embd, GetCount(file, a + "embedding_length"));
    return n_embd / *n_head;
  };
  TIERKV_ASSIGN_OR_RETURN(s.key_length, head_dim(a + "attention.key_length"));
  TIERKV_ASSIGN_OR_RETURN(s.value_length, head_dim(a + "attention.value_length"));
  if (s.key_length > (1ull << 24) || s.value_length > (1ull << 24)) {
    return Status::InvalidArgument("gguf: " + a + "attention key/value length out of range");
  }
  TIERKV_ASSIGN_OR_RETURN(s.context_length, file.GetOptional<uint64_t>(a + "context_length"));
  return s;
}

const std::vector<std::string>& KvCodecNames() {
  static const std::vector<std::string> kNames = {"f16", "q8_0", "q4_0", "tq4", "tq3"};
  return kNames;
}

std::optional<double> KvVectorBytes(std::string_view codec, uint64_t dim) {
  const double d = static_cast<double>(dim);
  if (codec == "f16") return 2.0 * d;
  if (codec == "q8_0") return 34.0 * d / 32.0;
  if (codec == "q4_0") return 18.0 * d / 32.0;
  if (codec == "tq4") return (4.0 * d + 16.0) / 8.0;
  if (codec == "tq3") return (3.0 * d + 16.0) / 8.0;
  return std::nullopt;
}

std::vector<KvCodecCost> KvBytesPerToken(const KvCacheShape& shape) {
  std::vector<KvCodecCost> out;
  for (const std::string& codec : KvCodecNames()) {
    const double per_head = *KvVectorBytes(codec, shape.key_length) + *KvVectorBytes(codec, shape.value_length);
    out.push_back({codec, static_cast<double>(shape.kv_heads_all_layers) * per_head});
  }
  return out;
}

std::string FormatInfoText(const GgufFile& file, const InfoOptions& options) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };

  line("file          " + (file.path().empty() ? std::string("<memory>") : file.path()));
  line("size          " + std::to_string(file.file_size()) + " bytes (" + FormatBytes(file.file_size()) + ")");
  line("format        GGUF v" + std::to_string(file.version()) + ", alignment " +
       std::to_string(file.alignment()) + ", tensor data at offset " + std::to_string(file.data_offset()));
  const std::string_view arch = file.architecture();
  line("architecture  " + (arch.empty() ? std::string("(none)") : EscapeGgufString(arch)));
  if (auto name = file.GetString("general.name"); name.ok()) line("name          " + EscapeGgufString(*name));

  // Metadata.
  line("");
  line("metadata (" + std::to_string(file.metadata().size()) + " keys)");
  GgufFormatOptions fmt;
  fmt.max_array_items = options.max_array_items;
  fmt.max_string_bytes = options.max_string_bytes;
  size_t key_w = 0, type_w = 0;
  for (const GgufKv& kv : file.metadata()) {
    key_w = std::max(key_w, EscapeGgufString(kv.key).size());
    type_w = std::max(type_w, GgufValueTypeString(kv.value).size());
  }
  for (const GgufKv& kv : file.metadata()) {
    line("  " + PadRight(EscapeGgufString(kv.key), key_w) + "  " +
         PadRight(GgufValueTypeString(kv.value), type_w) + "  " + FormatGgufValue(kv.value, fmt));
  }

  // Tensors.
  line("");
  line("tensors (" + std::to_string(file.tensors().size()) + ")");
  size_t name_w = 4, type_col = 4, shape_w = 5, bytes_w = 5, offset_w = 6;
  for (const GgufTensor& t : file.tensors()) {
    name_w = std::max(name_w, EscapeGgufString(t.name).size());
    type_col = std::max(type_col, std::string(t.traits().name).size());
    shape_w = std::max(shape_w, ShapeString(t).size());
    bytes_w = std::max(bytes_w, std::to_string(t.n_bytes).size());
    offset_w = std::max(offset_w, std::to_string(t.offset).size());
  }
  if (!file.tensors().empty()) {
    line("  " + PadRight("name", name_w) + "  " + PadRight("type", type_col) + "  " + PadRight("shape", shape_w) +
         "  " + PadLeft("bytes", bytes_w) + "  " + PadLeft("offset", offset_w));
  }
  for (const GgufTensor& t : file.tensors()) {
    line("  " + PadRight(EscapeGgufString(t.name), name_w) + "  " + PadRight(t.traits().name, type_col) + "  " +
         PadRight(ShapeString(t), shape_w) + "  " + PadLeft(std::to_string(t.n_bytes), bytes_w) + "  " +
         PadLeft(std::to_string(t.offset), offset_w));
  }
  line("");
  line("parameters    " + HumanCount(file.parameter_count()) + " (" + std::to_string(file.parameter_count()) + ")");
  line("tensor bytes  " + std::to_string(file.tensor_bytes()) + " (" + FormatBytes(file.tensor_bytes()) + ")");
  std::string mix;
  for (const TypeShare& t : TypeMix(file)) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (%.1f%%)", t.percent);
    mix += (mix.empty() ? "" : ", ") + t.name + " " + FormatBytes(t.bytes) + pct;
  }
  if (!mix.empty()) line("type mix      " + mix);
  // What `tierkv run --chat` would use (nothing when the file has no template).
  if (const auto chat = ModelChatFormat(file); chat.status().code() != StatusCode::kNotFound) {
    line("chat format   " + (chat.ok() ? std::string(ChatFamilyName(chat->family)) + " (run --chat)"
                                       : chat.status().message()));
  }

  // KV cache.
  line("");
  Result<KvCacheShape> shape = ReadKvCacheShape(file);
  if (!shape.ok()) {
    line("kv cache      not available: " + shape.status().message());
    return out;
  }
  std::string dims = "n_layer " + std::to_string(shape->n_layer) + ", n_head_kv " + std::to_string(shape->n_head_kv);
  if (shape->key_length == shape->value_length) {
    dims += ", head_dim " + std::to_string(shape->key_length);
  } else {
    dims += ", key_length " + std::to_string(shape->key_length) + ", value_length " +
            std::to_string(shape->value_length);
  }
  line("kv cache per token, K and V (" + dims + ")");
  const bool ctx = shape->context_length.has_value() && *shape->context_length > 0;
  line("  codec  bytes/token" + (ctx ? "  at context_length " + std::to_string(*shape->context_length) : ""));
  for (const KvCodecCost& c : KvBytesPerToken(*shape)) {
    std::string row = "  " + PadRight(c.codec, 5) + "  " + PadLeft(TrimmedNumber(c.bytes_per_token), 11);
    if (ctx) {
      const double total = c.bytes_per_token * static_cast<double>(*shape->context_length);
      row += "  " + FormatBytes(static_cast<uint64_t>(std::llround(total)));
    }
    line(row);
  }
  return out;
}

std::string FormatInfoJson(const GgufFile& file, const InfoOptions& options) {
  Json j;
  j["file"] = file.path();
  j["file_size"] = file.file_size();
  j["version"] = file.version();
  j["alignment"] = file.alignment();
  j["data_offset"] = file.data_offset();
  j["architecture"] = std::string(file.architecture());
  Json meta = Json::object();
  for (const GgufKv& kv : file.metadata()) meta[std::string(kv.key)] = ValueJson(kv.value, options.max_array_items);
  j["metadata"] = std::move(meta);
  Json tensors = Json::array();
  for (const GgufTensor& t : file.tensors()) {
    Json shape = Json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    tensors.push_back(Json{{"name", std::string(t.name)},
                           {"type", t.traits().name},
                           {"shape", std::move(shape)},
                           {"n_elements", t.n_elements},
                           {"bytes", t.n_bytes},
                           {"offset", t.offset}});
  }
  j["tensor_count"] = file.tensors().size();
  j["tensors"] = std::move(tensors);
  j["parameter_count"] = file.parameter_count();
  j["tensor_bytes"] = file.tensor_bytes();
  Json mix = Json::array();
  for (const TypeShare& t : TypeMix(file)) mix.push_back({{"type", t.name}, {"tensors", t.tensors}, {"bytes", t.bytes}});
  j["type_mix"] = std::move(mix);
  // The chat format `tierkv run --chat` would use: a name, or null (no template, or one
  // of a family tierkv does not format).
  const auto chat = ModelChatFormat(file);
  j["chat_format"] = chat.ok() ? Json(ChatFamilyName(chat->family)) : Json(nullptr);
  Result<KvCacheShape> shape = ReadKvCacheShape(file);
  if (shape.ok()) {
    Json kv;
    kv["n_layer"] = shape->n_layer;
    kv["n_head_kv"] = shape->n_head_kv;
    kv["kv_heads_all_layers"] = shape->kv_heads_all_layers;
    kv["key_length"] = shape->key_length;
    kv["value_length"] = shape->value_length;
    kv["context_length"] = shape->context_length.has_value() ? Json(*shape->context_length) : Json(nullptr);
    Json per_token = Json::object();
    for (const KvCodecCost& c : KvBytesPerToken(*shape)) {
      // Whole bytes print as integers; fractions (head_dim not a multiple of 32) stay.
      const double v = c.bytes_per_token;
      per_token[c.codec] = v == std::floor(v) && v < 9e15 ? Json(static_cast<uint64_t>(v)) : Json(v);
    }
    kv["bytes_per_token"] = std::move(per_token);
    j["kv_cache"] = std::move(kv);
  } else {
    j["kv_cache"] = nullptr;
    j["kv_cache_error"] = shape.status().message();
  }
  // Token strings are not always valid UTF-8: replace bad bytes rather than throw.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

Result<std::string> RunInfo(const std::string& model, const InfoOptions& options) {
  if (model.empty()) return Status::InvalidArgument("no model given: tierkv info FILE.gguf");
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, OpenModelFile(model));
  return options.json ? FormatInfoJson(*file, options) : FormatInfoText(*file, options);
}

void AddInfoCommand(CLI::App& app, int& exit_code) {
  struct Args {
    std::string positional;
    std::string model;
    InfoOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("info", "Show a GGUF model's metadata, tensors, size and KV cache cost");
  sub->add_option("file", args->positional, "Model file (.gguf) or builtin:NAME");
  sub->add_option("-m,--model", args->model, "Model file (.gguf) or builtin:NAME (instead of FILE)");
  sub->add_flag("--json", args->options.json, "Print one JSON object on stdout");
  sub->add_option("--max-items", args->options.max_array_items, "Array items shown before summarizing")
      ->check(tools::NonNegative())
      ->capture_default_str();
  sub->callback([args, &exit_code] {
    if (!args->positional.empty() && !args->model.empty()) {
      std::fprintf(stderr, "error: info: give the model once, either as FILE or with --model\n");
      exit_code = 2;
      return;
    }
    const std::string& model = args->model.empty() ? args->positional : args->model;
    if (model.empty()) {  // a usage error: exit 2, as a bad option
      std::fprintf(stderr, "error: info: no model given: tierkv info FILE.gguf\n");
      exit_code = 2;
      return;
    }
    Result<std::string> out = RunInfo(model, args->options);
    if (!out.ok()) {
      std::fprintf(stderr, "error: info: %s\n", out.status().message().c_str());
      exit_code = 1;
      return;
    }
    std::fwrite(out->data(), 1, out->size(), stdout);
    exit_code = 0;
  });
}

}  // namespace tierkv
