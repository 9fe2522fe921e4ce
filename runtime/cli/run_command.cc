// runtime/cli/run_command.cc
#include "runtime/cli/run_command.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <deque>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "kvcache/session_file.h"
#include "memory/fd.h"
#include "memory/memory_manager.h"
#include "memory/size.h"
#include "runtime/chat_template.h"
#include "runtime/cli/usage_command.h"
#include "runtime/cli/run_report_json.h"
#include "runtime/run.h"

namespace tierkv {
namespace {

struct RunFlags {
  std::string model, prompt, prompt_file, session;
  std::string device = "none", vram = "0", host = "auto", disk = "0", disk_dir = "/tmp";
  std::string kv_type, kv_type_k, kv_type_v, mlock, policy = "lfu", frame = "auto";  // mlock "": not given
  static constexpr int kUnset = INT_MIN;
  int n = kUnset, ctx = 0, threads = 0, dump_logits = 0;
  SamplerOptions sampling;  // the sampling flags bind to its fields (llama.cpp's defaults, but greedy)
  bool ignore_eos = false;
  std::vector<std::string> reverse_prompts;
  bool chat = false, continue_chat = false, interactive = false;
  std::string system_prompt, chat_template;
  bool chat_template_given = false;  // --chat-template, even as ""
  bool sim_gbps_given = false, disk_dir_given = false;
  std::string seed = "0";
  bool session_given = false, prompt_file_given = false, system_prompt_given = false;
  double sim_gbps = 0;
  bool no_warmup = false, json = false, no_prefetch = false, llama_sums = false, no_llama_sums = false;
  std::string weights = "auto";
  int kv_batch = 0;
  int attn_topk = 0;
  std::string expert_split = "auto";
  int expert_admit = 1;
  int batch = 64;
  std::string rope_scaling;
  float rope_scale = 0, rope_freq_scale = 0, rope_freq_base = 0;
  float yarn_attn_factor = 0, yarn_beta_fast = 0, yarn_beta_slow = 0;
  int yarn_orig_ctx = 0;
  std::string gpu_layers;  // llama.cpp's -ngl: a count, auto or all
  std::string flash_attn;
  bool no_conversation = false, no_mmap = false;
  bool no_display_prompt = false;  // llama.cpp's: the prompt is not shown before the text
  bool mlock_given = false;        // --mlock, bare or with a value
  bool serve = false;              // `tierkv serve`'s flags: no prompt, no output flags
  std::string remote, remote_salt, remote_password_file;
  int remote_ttl = 7 * 24 * 3600, remote_timeout_ms = 500;
};

// --remote-password-file: its first line, surrounding spaces dropped.
Result<std::string> ReadRemotePassword(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return Status::InvalidArgument("--remote-password-file " + path + ": cannot be read");
  const size_t a = line.find_first_not_of(" \t\r");
  if (a == std::string::npos) return Status::InvalidArgument("--remote-password-file " + path + ": holds no password");
  return line.substr(a, line.find_last_not_of(" \t\r") - a + 1);
}

// A flag that names one of a few choices: the value of `value` in `choices`, or the
// error "FLAG must be a, b or c, not 'VALUE'".
template <typename T>
Result<T> ParseChoice(std::string_view flag, const std::string& value,
                      std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::string names;
  size_t i = 0;
  for (const auto& [name, choice] : choices) {
    if (name == value) return choice;
    names += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(name);
    ++i;
  }
  return Status::InvalidArgument(std::string(flag) + " must be " + names + ", not '" + value + "'");
}

// llama.cpp's RoPE flags. --rope-scale N and --rope-freq-scale 1/N say the same.
Result<RopeOverrides> ToRope(const RunFlags& f) {
  RopeOverrides r;
  if (!f.rope_scaling.empty()) {
    TIERKV_ASSIGN_OR_RETURN(r.scaling, ParseChoice<RopeScaling>("--rope-scaling", f.rope_scaling,
                                                                {{"none", RopeScaling::kNone},
                                                                 {"linear", RopeScaling::kLinear},
                                                                 {"yarn", RopeScaling::kYarn}}));
  }
  if (f.rope_scale < 0 || f.rope_freq_scale < 0) return Status::InvalidArgument("--rope-scale and --rope-freq-scale must be positive");
  if (f.rope_scale > 0 && f.rope_freq_scale > 0 && std::fabs(f.rope_scale * f.rope_freq_scale - 1.0f) > 1e-6f) {
    return Status::InvalidArgument("--rope-scale " + std::to_string(f.rope_scale) + " and --rope-freq-scale " +
                                   std::to_string(f.rope_freq_scale) + " disagree (one is the other's inverse)");
  }
  r.scale_factor = f.rope_scale > 0 ? f.rope_scale : f.rope_freq_scale > 0 ? 1.0f / f.rope_freq_scale : 0.0f;
  r.freq_base = f.rope_freq_base;
  r.orig_ctx = f.yarn_orig_ctx;
  r.yarn_attn_factor = f.yarn_attn_factor;
  r.yarn_beta_fast = f.yarn_beta_fast;
  r.yarn_beta_slow = f.yarn_beta_slow;
  // Out-of-range values are bad flags (exit 2), found before the model loads.
  ModelConfig probe;
  probe.context_length = 1;
  TIERKV_RETURN_IF_ERROR(ApplyRopeOverrides(r, 0, &probe));
  return r;
}

// A prompt file larger than this is refused whatever the context: more text than any
// context holds (a byte a token is 256 M tokens). Below it, RunSession's bound decides
// (the context's tokens x the longest token's bytes), and only that much is read.
constexpr size_t kMaxPromptBytes = size_t{256} << 20;

std::string PromptFileName(const std::string& path) {
  return path == "-" ? "the prompt from standard input (-f -)" : "--prompt-file " + path;
}

// -f FILE before anything loads: a directory, or a file that cannot be opened, named now.
Status CheckPromptFile(const std::string& path) {
  if (path == "-") return Status::Ok();
  const std::string what = PromptFileName(path);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Status::InvalidArgument(what + ": a directory, not a file");
  if (!UniqueFd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)).valid()) return Status::FromErrno(errno, what);
  return Status::Ok();
}

}  // namespace

Result<std::string> ReadPromptFile(const std::string& path, size_t max_bytes) {
  const bool stdin_ = path == "-";
  const std::string what = PromptFileName(path);
  TIERKV_RETURN_IF_ERROR(CheckPromptFile(path));
  UniqueFd file;  // standard input stays open
  if (!stdin_) {
    file.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!file.valid()) return Status::FromErrno(errno, what);
  }
  const int fd = stdin_ ? STDIN_FILENO : file.get();
  // One byte past the bound says "more" without reading the rest (-f /dev/zero).
  const size_t limit = std::min(max_bytes, kMaxPromptBytes) + 1;
  std::string text;
  std::vector<char> buf(size_t{1} << 16);
  Status st = Status::Ok();
  while (text.size() < limit) {
    const ssize_t n = read(fd, buf.data(), std::min(buf.size(), limit - text.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      st = Status::FromErrno(errno, "reading " + what);
      break;
    }
    if (n == 0) break;
    text.append(buf.data(), static_cast<size_t>(n));
  }
  if (!st.ok()) return st;
  if (text.size() > kMaxPromptBytes) {
    return Status::InvalidArgument(what + ": more than " + FormatBytes(kMaxPromptBytes) + ", more than any context holds");
  }
  return text;
}

namespace {

// --session FILE, found now rather than at the save after the whole run: a path that is
// not a regular file, a file this process cannot write, or a directory where the save
// cannot create its new file (the directory of the file a chain of links ends at).
Status CheckSessionPath(const std::string& session) {
  namespace fs = std::filesystem;
  const std::string flag = "--session " + session;
  std::error_code ec;
  const fs::path target(SessionFile::SaveTarget(session));
  const fs::file_status st = fs::status(target, ec);
  // A missing file or directory is found below; a loop of links or a name too long is
  // named here.
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return Status::InvalidArgument(flag + ": " + ec.message());
  }
  const bool exists = fs::exists(st);
  if (exists && !fs::is_regular_file(st)) {
    return Status::InvalidArgument(flag + ": " + (fs::is_directory(st) ? "a directory" : "not a regular file"));
  }
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument(flag + ": " + dir.string() +
                                   (fs::exists(dir, ec) ? " is not a directory" : ": directory does not exist"));
  }
  if (exists) {
    // An append rewrites it in place (O_RDWR: refused for read-only, immutable and
    // append-only files alike).
    if (!UniqueFd(open(target.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC)).valid()) {
      return Status::FromErrno(errno, flag + ": cannot write the file");
    }
  }
  // The save's own new file made there and removed: access(W_OK) says yes to root even
  // where nothing can be created (/proc).
  const std::string probe = SessionFile::TempPathFor(target.string());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno != EEXIST) {
    return Status::FromErrno(errno, flag + ": cannot create a file in " + dir.string());
  }
  if (fd >= 0) {
    close(fd);
    unlink(probe.c_str());
  }
  return Status::Ok();
}

Result<RunOptions> ToOptions(const RunFlags& f) {
  RunOptions o;
  if (f.model.empty()) return Status::InvalidArgument("--model is required");
  o.model = f.model;
  if (!f.prompt_file.empty() && !f.prompt.empty()) {
    return Status::InvalidArgument("give the prompt once: -p TEXT or -f FILE, not both");
  }
  if (f.prompt_file_given && f.prompt_file.empty()) return Status::InvalidArgument("--prompt-file must name a file");
  if (f.system_prompt_given && f.system_prompt.empty()) {
    return Status::InvalidArgument("--system-prompt (-sys) must not be empty");
  }
  // -f is read by the run, once it knows how much can fit (RunOptions::read_prompt);
  // a path that cannot be a prompt is named now.
  if (!f.prompt_file.empty()) TIERKV_RETURN_IF_ERROR(CheckPromptFile(f.prompt_file));
  o.prompt = f.prompt;
  if (f.interactive && f.prompt_file == "-") {
    return Status::InvalidArgument("-i reads its inputs from standard input: give the prompt with -p or -f FILE");
  }
  // One rule for every vocabulary (a llama one ran on BOS alone, a qwen one had no
  // token): a run needs a prompt; an interactive one starts from its first input.
  if (!f.serve && !f.interactive && f.prompt.empty() && f.prompt_file.empty()) {
    return Status::InvalidArgument(kNoPromptMessage);
  }
  // -n: 32 for a one-shot run; each reply until its end (-1) in an interactive one.
  if (f.n != RunFlags::kUnset && f.n < -1) {
    return Status::InvalidArgument("-n must be -1 (until end of generation or a full context) or more");
  }
  o.n_predict = f.n != RunFlags::kUnset ? f.n : f.interactive ? -1 : 32;
  o.ignore_eos = f.ignore_eos;
  for (const std::string& rp : f.reverse_prompts) {
    if (rp.empty()) return Status::InvalidArgument("-r: a reverse prompt must not be empty");
  }
  o.reverse_prompts = f.reverse_prompts;
  // -sys, --chat-template and --continue say "chat" on their own, as in llama.cpp's
  // conversation mode.
  o.chat = f.chat || f.continue_chat || !f.system_prompt.empty() || !f.chat_template.empty();
  o.system_prompt = f.system_prompt;
  o.continue_chat = f.continue_chat;
  if (f.continue_chat && f.session.empty()) {
    return Status::InvalidArgument("--continue needs --session FILE (the conversation to continue)");
  }
  o.chat_template = f.chat_template;
  if (f.chat_template_given && f.chat_template.empty()) {
    return Status::InvalidArgument("--chat-template must not be empty (a format name or a template text)");
  }
  if (!f.chat_template.empty()) {
    auto format = DetectChatFormat(f.chat_template);
    if (!format.ok()) return Status::InvalidArgument("--chat-template: " + format.status().message());
  }
  if (f.ctx < 0) return Status::InvalidArgument("-c/--ctx must not be negative (0: the default)");
  o.n_ctx = f.ctx;
  o.sampler = f.sampling;
  // -s -1: a random seed, as in llama.cpp (reported on stderr, so the run can be repeated).
  if (f.seed == "-1") {
    // 32 bits, as llama.cpp draws: short to type back, and exact in --json for readers
    // that parse numbers as doubles.
    o.sampler.seed = static_cast<uint32_t>(std::random_device{}());
    spdlog::info("sampling seed {}", o.sampler.seed);
  } else {
    const char* end = f.seed.data() + f.seed.size();
    const auto [ptr, ec] = std::from_chars(f.seed.data(), end, o.sampler.seed);
    if (f.seed.empty() || ec != std::errc() || ptr != end) {
      return Status::InvalidArgument("-s/--seed must be -1 (random) or a seed 0.." +
                                     std::to_string(std::numeric_limits<uint64_t>::max()) + ", not '" + f.seed + "'");
    }
  }
  TIERKV_RETURN_IF_ERROR(o.sampler.Validate());
  if (f.threads < 0) return Status::InvalidArgument("-t/--threads must not be negative (0: all cores)");
  // At most one a CPU: -t 64 on 2 CPUs decoded 25x slower, and -t 100000 did not finish
  // starting its threads in a minute (docs/decisions/2026-12-04-threads-capped-to-affinity.md).
  o.threads = ThreadsWithinCpus(f.threads);
  if (f.dump_logits < 0) return Status::InvalidArgument("--dump-logits must not be negative");
  if (f.dump_logits > 0 && !f.json) {
    return Status::InvalidArgument("--dump-logits reports in the JSON output: give --json as well");
  }
  o.dump_logits = f.dump_logits;
  o.session = f.session;
  if (f.session_given && f.session.empty()) return Status::InvalidArgument("--session must name a file");
  if (!f.session.empty()) TIERKV_RETURN_IF_ERROR(CheckSessionPath(f.session));
  // --kv-type, -ctk and -ctv name one codec (K and V share it): those given must agree.
  std::string kv, kv_flag;
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--kv-type", &f.kv_type},
                                    {"-ctk", &f.kv_type_k}, {"-ctv", &f.kv_type_v}}) {
    if (value->empty()) continue;
    if (!kv.empty() && *value != kv) {
      return Status::InvalidArgument("K and V share one codec: " + kv_flag + " " + kv + " and " + flag + " " + *value +
                                     " differ");
    }
    kv = *value;
    kv_flag = flag;
  }
  if (kv.empty()) kv = "f16";
  TIERKV_ASSIGN_OR_RETURN(o.kv_type, ParseKvCodec(kv));
  if (f.remote.empty() && (!f.remote_salt.empty() || !f.remote_password_file.empty())) {
    return Status::InvalidArgument("--remote-salt and --remote-password-file need --remote");
  }
  if (f.remote_ttl < 1) return Status::InvalidArgument("--remote-ttl must be at least 1 (seconds)");
  if (f.remote_timeout_ms < 1) return Status::InvalidArgument("--remote-timeout-ms must be at least 1");
  if (!f.remote.empty()) {
    o.remote.url = f.remote;
    o.remote.salt = f.remote_salt;
    o.remote.ttl_s = f.remote_ttl;
    o.remote.timeout_ms = f.remote_timeout_ms;
    TIERKV_RETURN_IF_ERROR(RemoteTier::CheckOptions(o.remote).Annotate("--remote"));
    if (!f.remote_password_file.empty()) {
      TIERKV_ASSIGN_OR_RETURN(o.remote.password, ReadRemotePassword(f.remote_password_file));
    }
  }
  MemoryOptions& m = o.memory;
  TIERKV_ASSIGN_OR_RETURN(m.device, ParseDeviceKind(f.device));
  // A size names its flag: "--vram auto: size 'auto' does not start with a number".
  const auto size = [](const char* flag, const std::string& text) -> Result<uint64_t> {
    auto bytes = ParseSize(text);
    if (!bytes.ok()) return bytes.status().Annotate(std::string(flag) + " " + text);
    return bytes;
  };
  TIERKV_ASSIGN_OR_RETURN(m.device_bytes, size("--vram", f.vram));
  if (m.device == DeviceKind::kNone && m.device_bytes > 0) {
    spdlog::warn("--vram {} is ignored: --device none has no device tier (use --device cuda or sim)", f.vram);
    m.device_bytes = 0;
  }
  o.auto_host = f.host == "auto";
  if (!o.auto_host) {
    TIERKV_ASSIGN_OR_RETURN(m.host_bytes, size(f.serve ? "--ram" : "--host", f.host));
  }
  TIERKV_ASSIGN_OR_RETURN(m.disk_bytes, size("--disk", f.disk));
  o.auto_frame = f.frame == "auto";
  if (!o.auto_frame) {
    TIERKV_ASSIGN_OR_RETURN(m.frame_bytes, size("--frame", f.frame));
    TIERKV_RETURN_IF_ERROR(MemoryManager::CheckFrameBytes(m.frame_bytes).Annotate("--frame " + f.frame));
  }
  TIERKV_ASSIGN_OR_RETURN(m.mlock, ParseMlockMode(f.mlock.empty() ? "try" : f.mlock));
  o.mlock_asked = f.mlock_given;
  TIERKV_ASSIGN_OR_RETURN(m.policy, ParsePolicyKind(f.policy));
  m.disk_dir = f.disk_dir;
  if (f.disk_dir_given && m.disk_bytes == 0) {
    spdlog::warn("--disk-dir {} is ignored: no --disk budget, so no disk tier", f.disk_dir);
  }
  if (!(f.sim_gbps >= 0)) return Status::InvalidArgument("--sim-gbps must be a bandwidth >= 0 (0: unthrottled)");
  if (f.sim_gbps_given && m.device != DeviceKind::kSim) {
    spdlog::warn("--sim-gbps is ignored: it throttles --device sim only");
  }
  m.sim_gbps = f.sim_gbps;
  m.warmup = !f.no_warmup;
  o.prefetch = !f.no_prefetch;
  if (f.llama_sums && f.no_llama_sums) {
    return Status::InvalidArgument("give --llama-sums or --no-llama-sums, not both");
  }
  o.llama_sums = f.llama_sums ? RunOptions::LlamaSums::kOn : RunOptions::LlamaSums::kOff;
  if (f.no_conversation && o.chat) {
    return Status::InvalidArgument("-no-cnv (no chat) contradicts --chat, -sys, --chat-template or --continue");
  }
  // -ngl: a layer count (negative, as llama.cpp takes it, for none asked), auto or all.
  const std::string& ngl = f.gpu_layers;
  const size_t digits_from = !ngl.empty() && ngl[0] == '-' ? 1 : 0;
  const bool count = ngl.size() > digits_from && ngl.find_first_not_of("0123456789", digits_from) == std::string::npos;
  if (!ngl.empty() && !count && ngl != "auto" && ngl != "all") {
    return Status::InvalidArgument("-ngl/--n-gpu-layers must be a layer count, auto or all, not '" + ngl + "'");
  }
  const bool wants_layers = count ? digits_from == 0 && ngl.find_first_not_of('0') != std::string::npos : !ngl.empty();
  if (wants_layers) {
    spdlog::warn("-ngl {} is ignored: this build computes on the CPU and places weights and KV pages by the --host and "
                 "--disk budgets",
                 f.gpu_layers);
  }
  static const char* kFlashValues[] = {"on", "off", "auto", "1", "0", "-1", "true", "false", "enabled", "disabled"};
  if (!f.flash_attn.empty() &&
      std::none_of(std::begin(kFlashValues), std::end(kFlashValues), [&](const char* v) { return f.flash_attn == v; })) {
    return Status::InvalidArgument("--flash-attn must be on, off or auto, not '" + f.flash_attn + "'");
  }
  if (f.no_mmap && f.weights != "auto" && f.weights != "paged") {
    return Status::InvalidArgument("--no-mmap (paged weights) contradicts --weights " + f.weights);
  }
  using Weights = RunOptions::Weights;
  TIERKV_ASSIGN_OR_RETURN(o.weights, ParseChoice<Weights>("--weights", f.no_mmap ? "paged" : f.weights,
                                                          {{"auto", Weights::kAuto},
                                                           {"paged", Weights::kPaged},
                                                           {"mapped", Weights::kMapped}}));
  if (f.kv_batch < 0) return Status::InvalidArgument("--kv-batch must be >= 0");
  o.kv_batch_blocks = f.kv_batch;
  if (f.attn_topk < 0) return Status::InvalidArgument("--attn-topk must be >= 0");
  o.attn_topk = f.attn_topk;
  using Split = ModelOptions::ExpertSplit;
  TIERKV_ASSIGN_OR_RETURN(o.expert_split, ParseChoice<Split>("--expert-split", f.expert_split,
                                                             {{"auto", Split::kAuto},
                                                              {"device", Split::kDevice},
                                                              {"host", Split::kHost}}));
  if (f.expert_admit < 0) return Status::InvalidArgument("--expert-admit must be >= 0");
  o.expert_admit = f.expert_admit;
  if (f.batch < 1) return Status::InvalidArgument("-b/--batch-size must be >= 1");
  o.batch = f.batch;
  TIERKV_ASSIGN_OR_RETURN(o.rope, ToRope(f));
  o.echo_prompt = !f.no_display_prompt && !f.json;
  return o;
}

// Whether stderr's last line is an open "> " prompt whose input was not echoed (standard
// input is not a terminal): an error then starts a line of its own.
bool g_prompt_open = false;
// Whether the last "> " got no input (end of input, Ctrl-D or Ctrl-C at it): its line is
// still open, also on a terminal, and the summary starts a line of its own.
bool g_prompt_ended = false;

// Where a run's text goes, piece by piece, each flushed as it comes: stdout (llama-cli's
// way: `tierkv run ... > out.txt` holds the text), or stderr beside --json's object. On
// a terminal, control bytes other than newline and tab are shown as \xNN (a builtin
// model's synthetic text is arbitrary bytes, which must not drive the terminal), and so
// they are on stderr always (it is a log); a file or a pipe gets the text's own bytes.
// A failed write (a full disk, a closed pipe: EPIPE, SIGPIPE being ignored) is kept with
// its errno, and nothing more is written.
class TextOut {
 public:
  explicit TextOut(std::FILE* out) : out_(out), escape_(out == stderr || isatty(fileno(out)) == 1) {}

  // False once a write has failed.
  bool Write(std::string_view piece) {
    if (failed_) return false;
    if (piece.empty()) return true;
    std::string shown;
    for (const char ch : piece) {
      const auto b = static_cast<unsigned char>(ch);
      if (escape_ && ((b < 0x20 && ch != '\n' && ch != '\t') || b == 0x7f)) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02X", b);
        shown += hex;
      } else {
        shown += ch;
      }
    }
    errno = 0;
    if (std::fwrite(shown.data(), 1, shown.size(), out_) != shown.size() || std::fflush(out_) != 0) {
      error_ = errno;
      failed_ = true;
      return false;
    }
    line_open_ = shown.back() != '\n';
    return true;
  }

  // Ends a line of text left open where it shares the screen with stderr's next line
  // (stdout on a terminal, or stderr itself); a file or a pipe keeps the text's bytes.
  void EndLine() {
    if (!line_open_ || failed_) return;
    line_open_ = false;
    if (out_ == stderr || escape_) {
      std::fputc('\n', out_);
      std::fflush(out_);
    }
  }

  int error() const { return error_; }  // errno of the failed write (0: none, or unknown)

 private:
  std::FILE* out_;
  bool escape_;
  bool line_open_ = false;
  bool failed_ = false;
  int error_ = 0;
};

// -i: one input per line from standard input ("> " on stderr asks for it); a line
// ending in a backslash goes on to the next one. Blank inputs are skipped. Raw text (no
// --chat) gets its newline back: the user pressed Enter after it. End of input (or a
// Ctrl-C at the prompt) ends the conversation.
std::optional<std::string> ReadInput(bool chat) {
  for (;;) {
    std::fputs("\n> ", stderr);
    g_prompt_open = isatty(STDIN_FILENO) == 0;
    std::fflush(stderr);
    std::string text, line;
    bool any = false;
    while (std::getline(std::cin, line)) {
      any = true;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty() && line.back() == '\\') {
        line.pop_back();
        text += line + "\n";
        continue;
      }
      text += line;
      break;
    }
    if (!any) {
      g_prompt_ended = true;
      return std::nullopt;
    }
    if (text.find_first_not_of(" \t\n") == std::string::npos) {
      if (!std::cin) {
        g_prompt_ended = true;
        return std::nullopt;
      }
      continue;
    }
    if (!chat) text += '\n';
    return text;
  }
}

// Ctrl-C: the first asks the run to stop (the prefill after its current chunk, or the
// current reply), the second ends the process as usual.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnSigint(int) {
  if (g_stop.exchange(true)) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

// Installs OnSigint for its lifetime, without SA_RESTART: a read of standard input
// waiting for the next turn returns (EINTR) and ends the conversation.
class SigintScope {
 public:
  SigintScope() {
    g_stop.store(false);
    struct sigaction sa = {};
    sa.sa_handler = OnSigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    installed_ = sigaction(SIGINT, &sa, &old_) == 0;
  }
  ~SigintScope() {
    if (installed_) sigaction(SIGINT, &old_, nullptr);
  }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  struct sigaction old_ = {};
  bool installed_ = false;
};

// A long prefill reports its progress on stderr every kProgressSeconds.
constexpr double kProgressSeconds = 10.0;

}  // namespace

std::string FormatPrefillProgress(const RunOptions::PrefillProgress& at, double elapsed_s) {
  const double rate = elapsed_s > 0 ? at.done / elapsed_s : 0;
  const double left = rate > 0 ? (at.total - at.done) / rate : 0;
  char line[256];
  std::snprintf(line, sizeof line, "prefill: %d / %d tokens (context %d / %d), %.0f tok/s, %.0f s, %.0f s left", at.done,
                at.total, at.position, at.end, rate, elapsed_s, left);
  std::string out = line;
  if (!at.residency.empty()) out += "; " + at.residency;
  return out + "\n";
}

namespace {

}  // namespace

namespace {

// llama.cpp's spellings CLI11 cannot declare (multi-letter single-dash words), and the
// long option each stands for; --conversation is llama.cpp's long form of -cnv. `tierkv
// serve` shares the runtime flags (-ctk, -ngl, ...) and adds llama-server's -np.
char kCacheTypeK[] = "--cache-type-k", kCacheTypeV[] = "--cache-type-v", kChat[] = "--chat",
     kSystemPrompt[] = "--system-prompt", kGpuLayers[] = "--n-gpu-layers", kFlashAttn[] = "--flash-attn",
     kNoConversation[] = "--no-conversation", kParallel[] = "--parallel";
const std::pair<const char*, char*> kLong[] = {
    {"-ctk", kCacheTypeK}, {"-ctv", kCacheTypeV}, {"-cnv", kChat}, {"--conversation", kChat},
    {"-sys", kSystemPrompt}, {"-ngl", kGpuLayers}, {"-fa", kFlashAttn}, {"-no-cnv", kNoConversation}};
// `tierkv serve`'s own (llama-server's -np).
const std::pair<const char*, char*> kServeLong[] = {{"-np", kParallel}};

// tierkv run --help lists llama.cpp's spellings beside the option they stand for
// ("-ngl,--n-gpu-layers,--gpu-layers TEXT"): NormalizeLlamaFlags rewrites them before
// CLI11 parses, so CLI11 alone does not know them.
class RunHelpFormatter : public CLI::Formatter {
 public:
  RunHelpFormatter() { column_width(42); }
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    std::string extra;
    for (const auto& [from, to] : kLong) {
      if (opt->check_lname(std::string(to).substr(2))) extra += std::string(from) + ",";
    }
    return extra + CLI::Formatter::make_option_name(opt, positional);
  }
};

}  // namespace

std::vector<std::pair<std::string, std::string>> LlamaFlagSpellings() {
  std::vector<std::pair<std::string, std::string>> all;
  for (const auto& [from, to] : kLong) all.emplace_back(from, to);
  return all;
}

std::string RunSummary(const RunReport& r, bool interactive) {
  const auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  std::string out;
  char line[512];
  // Why generation stopped, in one line (one-shot runs; an interactive run's replies end
  // at the next "> ", its context full with a warning).
  if (!interactive) {
    std::string why;
    switch (r.stop_reason) {
      case StopReason::kEog: why = "end-of-generation token"; break;
      case StopReason::kLimit:
        why = "-n limit reached (" + std::to_string(r.generated_tokens.size()) + " tokens)";
        break;
      case StopReason::kContextFull: why = "the context is full (" + std::to_string(r.n_ctx) + " tokens, -c)"; break;
      case StopReason::kReversePrompt: why = "reverse prompt '" + r.reverse_prompt + "' (-r)"; break;
      case StopReason::kInterrupted:
        why = r.interrupted ? "interrupted (Ctrl-C) during the prefill, after " + std::to_string(r.prefill_tokens) +
                                  " of " + std::to_string(r.prompt_tokens.size() - r.reused_prefix_tokens) +
                                  " prompt tokens" +
                                  (r.saved ? "; the session holds them, and the same command resumes there" : "")
                            : "interrupted (Ctrl-C)";
        break;
      case StopReason::kOutputFailed: why = "the text could not be written"; break;
      case StopReason::kNone: break;
    }
    if (!why.empty()) out += "stopped: " + why + "\n";
  } else if (r.interrupted) {
    out += std::string("interrupted: the last input was dropped; the conversation ends as it was before it") +
           (r.saved ? " (saved)" : "") + "\n";
  }
  // Tokens computed and the rate they were computed at (a stopped prefill's computed part,
  // not the whole prompt; no rate for a few tokens, such as the one a restored session
  // recomputes for its logits: that is no prefill speed).
  constexpr int kFewestRated = 16;
  char prefill_rate[64];
  if (r.prefill_tokens < kFewestRated) {
    std::snprintf(prefill_rate, sizeof prefill_rate, "too few for a rate");
  } else {
    std::snprintf(prefill_rate, sizeof prefill_rate, "%.1f tok/s", rate(r.prefill_tokens, r.prefill_s));
  }
  char reused[96];
  if (r.remote_tokens > 0) {
    std::snprintf(reused, sizeof reused, "%d reused, %d of them from the remote cache", r.reused_prefix_tokens,
                  r.remote_tokens);
  } else {
    std::snprintf(reused, sizeof reused, "%d reused from the session", r.reused_prefix_tokens);
  }
  std::snprintf(line, sizeof line,
                "prompt %zu tokens (%s), %d computed%s in %.3f s (%s); %zu generated "
                "in %.3f s (%.1f tok/s)\n",
                r.prompt_tokens.size(), reused, r.prefill_tokens,
                r.turns.size() > 1 ? " with the inputs" : "", r.prefill_s, prefill_rate,
                r.generated_tokens.size(), r.decode_s, rate(static_cast<double>(r.generated_tokens.size()), r.decode_s));
  out += line;
  if (r.remote) {
    const RemoteStats& m = *r.remote;
    std::snprintf(line, sizeof line,
                  "remote cache: %llu blocks fetched (%.1f MiB in %.3f s), %llu published, %llu held already, "
                  "%llu refused as damaged%s\n",
                  static_cast<unsigned long long>(m.hit_blocks), m.fetched_bytes / 1048576.0, m.fetch_us / 1e6,
                  static_cast<unsigned long long>(m.published_blocks), static_cast<unsigned long long>(m.present_blocks),
                  static_cast<unsigned long long>(m.verify_failures), m.connected ? "" : "; not reachable");
    out += line;
  }
  return out;
}

std::string NormalizeLlamaFlags(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "run") != 0 && std::strcmp(argv[1], "serve") != 0)) return "";
  // Options whose value is free text: "-p -xyz" is a prompt, not a flag.
  static const char* kText[] = {"-p", "--prompt", "-r", "--reverse-prompt", "--system-prompt", "-sys",
                                "--chat-template", "-f", "--prompt-file", "--file", "-m", "--model", "--session",
                                "--api-key", "--api-key-file", "--alias", "--session-dir", "--remote",
                                "--remote-salt", "--remote-password-file"};
  for (int i = 2; i < argc; ++i) {
    if (std::any_of(std::begin(kText), std::end(kText), [&](const char* t) { return std::strcmp(argv[i - 1], t) == 0; })) {
      continue;
    }
    // The word before any "=value" (-ngl=99).
    const std::string_view a = argv[i];
    const std::string_view word = a.substr(0, a.find('='));
    bool mapped = false;
    std::vector<std::pair<const char*, char*>> spellings(std::begin(kLong), std::end(kLong));
    if (std::strcmp(argv[1], "serve") == 0) spellings.insert(spellings.end(), std::begin(kServeLong), std::end(kServeLong));
    for (const auto& [from, to] : spellings) {
      if (word != from) continue;
      if (word.size() == a.size()) {
        argv[i] = to;
      } else {  // "--n-gpu-layers=99", kept for the rest of the process as argv is
        static std::deque<std::string> joined;  // a deque: its strings never move
        argv[i] = joined.emplace_back(std::string(to) + std::string(a.substr(word.size()))).data();
      }
      mapped = true;
      break;
    }
    // Any other single-dash word (-ub, -ncmoe) is a llama.cpp flag tierkv lacks; CLI11
    // would read it as a short flag and its value (-n "gl").
    if (!mapped && word.size() > 2 && word[0] == '-' && std::isalpha(static_cast<unsigned char>(word[1])) &&
        std::all_of(word.begin() + 1, word.end(),
                    [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '-'; })) {
      return "unknown flag " + std::string(word) + " (llama.cpp's flags that tierkv " + argv[1] +
             " reads are listed by tierkv " + argv[1] + " --help)";
    }
  }
  return "";
}

namespace {

// The flags of the model's run that `tierkv run` and `tierkv serve` share: tiers and
// budgets, kernels, KV codec, prefill batch, RoPE, and llama.cpp's flags that have no
// work to do here (accepted so that its command lines run).
// The host tier's budget is --host in `tierkv run`; `tierkv serve` takes --host as
// llama-server does, for the address, and names the budget --ram.
void AddRuntimeFlags(CLI::App* app, RunFlags* f) {
  app->add_option("--device", f->device, "cuda | sim | none (default none)");
  app->add_option("--vram", f->vram, "Device tier budget, e.g. 512MiB");
  app->add_option(f->serve ? "--ram,--host-budget" : "--host", f->host,
                  "Host tier budget, or auto (default: 1GiB, or with no device or disk tier enough for the "
                  "context's KV cache, at most 90% of available memory)");
  app->add_option("--disk", f->disk, "Disk tier budget (default 0: no disk tier)");
  app->add_option("--disk-dir", f->disk_dir, "Disk tier directory (default /tmp)");
  app->add_option("--sim-gbps", f->sim_gbps, "--device sim copy bandwidth in GB/s (0: unthrottled)");
  app->add_option("--frame", f->frame,
                  "frame size, 64KiB..4MiB, or auto (default: 1MiB for long contexts on big budgets, else 256KiB)");
  app->add_option("--policy", f->policy, "residency policy: lfu (default), lru, 2q");
  app->add_option("--kv-type", f->kv_type, "KV codec: f16 q8_0 q4_0 tq4 tq3 (default f16)");
  app->add_option("--cache-type-k", f->kv_type_k, "llama.cpp's -ctk (same as --kv-type)");
  app->add_option("--cache-type-v", f->kv_type_v, "llama.cpp's -ctv (must equal -ctk)");
  app->add_option("-t,--threads", f->threads, "kernel threads (default: all cores)");
  app->add_option("--mlock", f->mlock,
                  "off | try | require (bare --mlock, as llama.cpp's: try; default: locked where the process may, "
                  "silently)")
      ->expected(0, 1);
  app->add_flag("--no-warmup", f->no_warmup, "do not reserve and touch the arenas at start-up");
  app->add_flag("--no-prefetch", f->no_prefetch, "fetch pages only when the decoder needs them (no copy/compute overlap)");
  app->add_flag("--llama-sums", f->llama_sums,
                "f16 KV: llama.cpp's summation orders, its logits bit for bit (slower attention and prefill; for "
                "comparisons)");
  app->add_flag("--no-llama-sums", f->no_llama_sums, "f16 KV: the faster summation orders (the default)");
  app->add_option("--weights", f->weights,
                  "paged (pages under the budgets), mapped (read in place) or auto (default: paged with a device tier "
                  "or when they take at most half the host budget)");
  app->add_option("-b,--batch-size", f->batch,
                  "prompt tokens computed together, layer by layer (default 64; 1 = one at a time; same logits)");
  app->add_option("--kv-batch", f->kv_batch, "KV blocks attention pins at a time (0 = automatic)");
  app->add_option("--attn-topk", f->attn_topk,
                  "Selective attention: each decode step reads the first block, the last two and the N with the "
                  "highest key bounds per KV head (0 = every block; an approximation)");
  app->add_option("--expert-split", f->expert_split,
                  "MoE experts with --device: auto (the experts the device holds compute there, the others on the "
                  "CPU unless the cost model finds copying them faster; the default), device (copy every miss) or "
                  "host (every miss on the CPU); same logits");
  app->add_option("--expert-admit", f->expert_admit,
                  "hybrid experts: CPU-computed experts copied to the device in the background, per layer and step "
                  "(default 1)");
  app->add_option("--rope-scaling", f->rope_scaling, "RoPE scaling: none, linear, yarn (default: the model's)");
  app->add_option("--rope-scale", f->rope_scale, "RoPE context scaling factor N (the context grows N times)");
  app->add_option("--rope-freq-scale", f->rope_freq_scale, "RoPE frequency scale (1 / --rope-scale)");
  app->add_option("--rope-freq-base", f->rope_freq_base, "RoPE base frequency (default: the model's)");
  app->add_option("--yarn-orig-ctx", f->yarn_orig_ctx, "YaRN: the model's trained context (default: the model's)");
  app->add_option("--yarn-attn-factor", f->yarn_attn_factor, "YaRN: attention magnitude factor (default 1)");
  app->add_option("--yarn-beta-fast", f->yarn_beta_fast, "YaRN: low correction dimension (default: the model's, 32)");
  app->add_option("--yarn-beta-slow", f->yarn_beta_slow, "YaRN: high correction dimension (default: the model's, 1)");
  app->add_option("--n-gpu-layers,--gpu-layers", f->gpu_layers,
                  "llama.cpp's -ngl: ignored (tierkv places weights and KV pages by the --device/--vram budgets)");
  app->add_option("--flash-attn", f->flash_attn, "llama.cpp's -fa [on|off|auto]: ignored (attention is always fused)")
      ->expected(0, 1);
  app->add_flag("--no-mmap", f->no_mmap, "llama.cpp's --no-mmap: the same as --weights paged");
  app->add_option("--remote", f->remote,
                  "a KV cache shared with other tierkv processes on Redis: redis://[:PASSWORD@]HOST[:PORT][/DB] or "
                  "unix:///PATH (docs/remote.md)");
  app->add_option("--remote-salt", f->remote_salt, "tenant salt: blocks are shared only under the same salt");
  app->add_option("--remote-password-file", f->remote_password_file, "the Redis password: a file's first line");
  app->add_option("--remote-ttl", f->remote_ttl, "seconds a published block lives in Redis (default 604800, a week)");
  app->add_option("--remote-timeout-ms", f->remote_timeout_ms,
                  "longest wait for Redis's answer before computing instead (default 500)");
}

// Which flags were given (their values cannot say: --session "" is refused, --mlock
// bare means try).
void NoteGivenFlags(CLI::App* app, RunFlags* f) {
  const auto given = [app](const char* name) { return app->get_option_no_throw(name) != nullptr && app->count(name) > 0; };
  f->chat_template_given = given("--chat-template");
  f->sim_gbps_given = given("--sim-gbps");
  f->disk_dir_given = given("--disk-dir");
  f->session_given = given("--session");
  f->mlock_given = given("--mlock");
  if (f->mlock_given && f->mlock.empty()) f->mlock = "try";  // bare --mlock
  f->prompt_file_given = given("--prompt-file");
  f->system_prompt_given = given("--system-prompt");
}

}  // namespace

std::function<Result<RunOptions>()> AddServeRunFlags(CLI::App* sub) {
  auto f = std::make_shared<RunFlags>();
  f->serve = true;
  sub->add_option("-m,--model", f->model, "GGUF file (or builtin:NAME)")->required();
  sub->add_option("--chat-template", f->chat_template,
                  "chat format: chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, or a Jinja "
                  "template text (default: the model's tokenizer.chat_template)");
  AddRuntimeFlags(sub, f.get());
  return [f, sub] {
    NoteGivenFlags(sub, f.get());
    return ToOptions(*f);
  };
}

void AddRunCommand(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "Run a model: prefill the prompt, generate, report");
  run->formatter(std::make_shared<RunHelpFormatter>());
  run->add_option("-m,--model", f->model, "GGUF file (or builtin:NAME)")->required();
  run->add_option("-p,--prompt", f->prompt, "prompt text (shown on stdout before the generated text)");
  run->add_option("-f,--prompt-file,--file", f->prompt_file, "read the prompt from a file (- = standard input)");
  run->add_flag("--no-display-prompt", f->no_display_prompt, "do not show the prompt before the generated text");
  run->add_option("-n,--n-predict,--predict", f->n,
                  "tokens to generate (default 32; -1 = until end of generation or a full context); with -i, per "
                  "reply (default -1)");
  run->add_option("-c,--ctx,--ctx-size", f->ctx,
                  "context length (default: prompt + n; with -n -1 or -i the model's trained context, which -c may "
                  "pass only with --rope-scaling / --rope-scale)");
  run->add_option("--temp", f->sampling.temperature, "temperature; 0 = greedy (default)");
  run->add_option("--top-k", f->sampling.top_k, "top-k (default 40; <= 0 off)");
  run->add_option("--top-p", f->sampling.top_p, "top-p (default 0.95; 1 off)");
  run->add_option("--min-p", f->sampling.min_p, "min-p: drop tokens below p * the top probability (default 0.05; 0 off)");
  run->add_option("--repeat-penalty", f->sampling.repeat_penalty, "penalty on tokens of the last --repeat-last-n (default 1.0 = off)");
  run->add_option("--repeat-last-n", f->sampling.repeat_last_n, "tokens the penalties look back over (default 64; 0 off, -1 all)");
  run->add_option("--frequency-penalty", f->sampling.frequency_penalty, "minus count x F on repeated tokens (default 0)");
  run->add_option("--presence-penalty", f->sampling.presence_penalty, "minus P on tokens that occurred (default 0)");
  run->add_flag("--chat", f->chat, "the prompt is one user turn in the model's chat format (llama.cpp's -cnv)");
  run->add_flag("-i,--interactive", f->interactive,
                "after the reply, read the next input from standard input, one line each (with --chat a user turn), "
                "until its end; Ctrl-C stops a reply");
  run->add_option("-r,--reverse-prompt", f->reverse_prompts,
                  "end a reply when its text contains PROMPT (repeatable); with -i the next input follows it")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  run->add_flag("--continue", f->continue_chat,
                "append the prompt as the next user turn of the conversation in --session (implies --chat)");
  run->add_option("--system-prompt", f->system_prompt, "system message before the prompt (implies --chat)");
  run->add_option("--chat-template", f->chat_template,
                  "chat format: chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, or a Jinja template text "
                  "(default: the model's tokenizer.chat_template; implies --chat)");
  run->add_flag("--ignore-eos", f->ignore_eos, "never sample end-of-generation tokens; generate all -n tokens");
  run->add_option("-s,--seed", f->seed, "sampling seed (default 0; -1: a random one, printed)");
  run->add_option("--session", f->session, "session file: restored (longest common prefix reused) and saved");
  AddRuntimeFlags(run, f.get());
  run->add_flag("--no-conversation", f->no_conversation, "llama.cpp's -no-cnv: the default (a raw prompt, no chat)");
  run->add_option("--dump-logits", f->dump_logits, "report top-10 logits of the first and last N prompt positions and every step");
  run->add_flag("--json", f->json, "print one JSON object on stdout at the end (the text then streams to stderr)");
  run->callback([f, run, &exit_code] {
    g_prompt_open = false;
    g_prompt_ended = false;
    NoteGivenFlags(run, f.get());
    auto options = ToOptions(*f);
    if (!options.ok()) {
      std::fprintf(stderr, "error: %s\n", options.status().message().c_str());
      exit_code = 2;
      return;
    }
    // The text: on stdout, flushed piece by piece, the prompt first (llama-cli's way);
    // with --json on stderr (stdout holds the JSON object alone), without the prompt.
    TextOut text(f->json ? stderr : stdout);
    // (Beside --json the text is a log on stderr: a failure to write it stops nothing.)
    options->on_text = [&text, json = f->json](std::string_view piece) {
      g_prompt_open = false;
      return text.Write(piece) || json;
    };
    // -f is read once the run knows how much can fit; its errors are usage errors.
    bool prompt_error = false;
    if (!f->prompt_file.empty()) {
      options->read_prompt = [path = f->prompt_file, interactive = f->interactive,
                              &prompt_error](size_t max_bytes) -> Result<std::string> {
        auto read = ReadPromptFile(path, max_bytes);
        if (read.ok() && read->empty() && !interactive) {
          read = Status::InvalidArgument("no prompt: " + PromptFileName(path) + " is empty");
        }
        if (!read.ok()) prompt_error = true;
        return read;
      };
    }
    // Progress of long prefills: a line every kProgressSeconds.
    struct Progress {
      std::chrono::steady_clock::time_point began, shown;
      int last_done = 0;
    };
    auto progress = std::make_shared<Progress>();
    options->on_prefill_progress = [progress, &text](const RunOptions::PrefillProgress& at) {
      const auto now = std::chrono::steady_clock::now();
      Progress& p = *progress;
      if (at.done <= p.last_done || p.last_done == 0) p.began = p.shown = now;  // a prefill's first chunk
      p.last_done = at.done;
      if (std::chrono::duration<double>(now - p.shown).count() < kProgressSeconds || at.done == at.total) return;
      p.shown = now;
      text.EndLine();
      std::fputs(FormatPrefillProgress(at, std::chrono::duration<double>(now - p.began).count()).c_str(), stderr);
    };
    if (f->interactive) {
      options->next_turn = [chat = options->chat, &text] {
        text.EndLine();
        return ReadInput(chat);
      };
    }
    SigintScope sigint;
    options->stop = &g_stop;
    auto report = RunSession(*options);
    text.EndLine();
    if (!report.ok()) {
      std::fprintf(stderr, "%serror: %s\n", g_prompt_open ? "\n" : "", report.status().message().c_str());
      exit_code = prompt_error ? 2 : 1;
      return;
    }
    const RunReport& r = *report;
    if (r.output_failed) {
      // The text could not be written (the session, when given, is saved): one line.
      const int err = text.error();
      if (err != 0) {
        std::fprintf(stderr, "error: writing standard output: %s\n", std::strerror(err));
      } else {
        std::fputs("error: writing standard output failed\n", stderr);
      }
      exit_code = 1;
      return;
    }
    if (g_prompt_ended) std::fputc('\n', stderr);
    std::fputs(RunSummary(r, f->interactive).c_str(), stderr);
    if (f->json) std::printf("%s\n", RunReportJson(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    // Stopped by Ctrl-C: 130, as a shell reports SIGINT (an interactive reply cut short
    // is part of the conversation, not a failure).
    if (r.interrupted || (r.stopped && !f->interactive)) exit_code = 130;
  });
}

}  // namespace tierkv
