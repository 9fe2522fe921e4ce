// runtime/cli/session_command.cc
#include "runtime/cli/session_command.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "kvcache/session_file.h"
#include "kvcache/session_lock.h"
#include "memory/size.h"

namespace tierkv {
namespace {

// 64-bit hashes as 16 hex digits, as the table prints them: a JSON number above 2^53
// loses its low bits in JavaScript and in any reader that parses numbers as doubles.
std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

nlohmann::json SummaryJson(const SessionSummary& s) {
  const KvGeometry& g = s.geometry;
  return {{"version", s.version},
          {"model", {{"fingerprint", Hex64(s.model.hash)}, {"description", s.model.description}}},
          {"kv", {{"layers", g.n_layers}, {"kv_heads", g.n_kv_heads}, {"head_dim", g.head_dim},
                  {"block_tokens", g.block_tokens}, {"codec", KvCodecName(g.codec)}, {"codec_seed", Hex64(g.codec_seed)}}},
          {"commit", s.commit_seq},
          {"tokens", s.n_tokens},
          {"blocks", s.n_records},
          {"block_bytes", s.block_bytes},
          {"file_bytes", s.file_bytes},
          {"live_bytes", s.live_bytes},
          {"note", s.note}};
}

void PrintSummary(const SessionSummary& s, const std::string& path) {
  const KvGeometry& g = s.geometry;
  std::printf("session   %s\n", path.c_str());
  std::printf("format    version %u, commit %llu\n", s.version, static_cast<unsigned long long>(s.commit_seq));
  std::printf("model     %s (fingerprint %s)\n", s.model.description.c_str(), Hex64(s.model.hash).c_str());
  std::printf("kv        %s, codec seed %s\n", g.ToString().c_str(), Hex64(g.codec_seed).c_str());
  std::printf("tokens    %llu\n", static_cast<unsigned long long>(s.n_tokens));
  std::printf("blocks    %llu of %s\n", static_cast<unsigned long long>(s.n_records), FormatBytes(s.block_bytes).c_str());
  std::printf("file      %s, of which %s referenced by the last save (%.1f%% garbage from earlier saves)\n",
              FormatBytes(s.file_bytes).c_str(), FormatBytes(s.live_bytes).c_str(),
              s.file_bytes ? 100.0 * (1.0 - static_cast<double>(s.live_bytes) / static_cast<double>(s.file_bytes)) : 0.0);
  // The commit shown is an older one (the newest was damaged): run and save refuse the
  // file, verify fails on it (docs/cli.md).
  if (!s.note.empty()) std::printf("note      %s\n", s.note.c_str());
  if (!s.tokens.empty()) {
    std::printf("token ids");
    for (size_t i = 0; i < s.tokens.size() && i < 16; ++i) std::printf(" %d", s.tokens[i]);
    if (s.tokens.size() > 16) std::printf(" ... (%zu more)", s.tokens.size() - 16);
    std::printf("\n");
  }
}

}  // namespace

void AddSessionCommand(CLI::App& app, int& exit_code) {
  CLI::App* session = app.add_subcommand("session", "Inspect, verify or repair a saved session file");
  session->require_subcommand(1);
  struct Opts {
    std::string path;
    bool json = false;
  };
  auto inspect_opts = std::make_shared<Opts>();
  CLI::App* inspect = session->add_subcommand("inspect", "Print a session file's header, geometry and tokens");
  inspect->add_option("file", inspect_opts->path, "session file")->required();
  inspect->add_flag("--json", inspect_opts->json, "print one JSON object");
  inspect->callback([inspect_opts, &exit_code] {
    auto s = SessionFile::Inspect(inspect_opts->path);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.status().message().c_str());
      exit_code = 1;
      return;
    }
    if (inspect_opts->json) std::printf("%s\n", SummaryJson(*s).dump().c_str());
    else PrintSummary(*s, inspect_opts->path);
  });

  auto verify_opts = std::make_shared<Opts>();
  CLI::App* verify = session->add_subcommand("verify", "Check every block's checksum; names the first bad block");
  verify->add_option("file", verify_opts->path, "session file")->required();
  verify->add_flag("--json", verify_opts->json, "print one JSON object");
  verify->callback([verify_opts, &exit_code] {
    const auto t0 = std::chrono::steady_clock::now();
    SessionSummary summary;
    Status st = SessionFile::Verify(verify_opts->path, &summary);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      if (verify_opts->json) std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", st.message()}}.dump().c_str());
      exit_code = 1;
      return;
    }
    if (verify_opts->json) {
      auto j = SummaryJson(summary);
      j["ok"] = true;
      j["seconds"] = secs;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("ok: %llu blocks, %llu tokens verified in %.3f s (%s)\n", static_cast<unsigned long long>(summary.n_records),
                  static_cast<unsigned long long>(summary.n_tokens), secs, verify_opts->path.c_str());
    }
  });

  auto repair_opts = std::make_shared<Opts>();
  CLI::App* repair = session->add_subcommand(
      "repair", "Roll a file whose newest save is damaged back to the save before it (a copy is kept as FILE.damaged)");
  repair->add_option("file", repair_opts->path, "session file")->required();
  repair->callback([repair_opts, &exit_code] {
    const std::string& path = repair_opts->path;
    // Beside the file the links end at, where a save would write.
    const std::string backup = SessionFile::SaveTarget(path) + ".damaged";
    SessionSummary summary;
    bool repaired = false;
    // A writer like a run: refused, naming the holder, while a run has the session.
    SessionLock::Options lo;
    lo.wait = false;
    lo.command = "tierkv session repair";
    auto lock = SessionLock::Acquire(path, lo);
    if (!lock.ok()) {
      std::fprintf(stderr, "error: %s\n", lock.status().message().c_str());
      exit_code = 1;
      return;
    }
    if (Status st = SessionFile::Repair(path, backup, &repaired, &summary); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      exit_code = 1;
      return;
    }
    if (!repaired) {
      std::printf("ok: nothing to repair, save %llu is intact (%llu blocks, %llu tokens verified) (%s)\n",
                  static_cast<unsigned long long>(summary.commit_seq), static_cast<unsigned long long>(summary.n_records),
                  static_cast<unsigned long long>(summary.n_tokens), path.c_str());
      return;
    }
    std::printf("repaired: %s rolled back to save %llu (%llu tokens, %llu blocks verified); the damaged file is kept as %s\n",
                path.c_str(), static_cast<unsigned long long>(summary.commit_seq),
                static_cast<unsigned long long>(summary.n_tokens), static_cast<unsigned long long>(summary.n_records),
                backup.c_str());
  });
}

}  // namespace tierkv
