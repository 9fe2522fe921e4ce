// runtime/cli/serve_command.cc
#include "runtime/cli/serve_command.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cli/run_command.h"
#include "runtime/server/server.h"

namespace tierkv {
namespace {

struct ServeFlags {
  std::string host = "127.0.0.1";
  int port = 8080;
  int ctx = 0;
  int slots = 4;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string session_dir;
  int queue = 64;
  std::string alias;
};

// --api-key-file: one key a line (blank lines and surrounding spaces ignored).
Result<std::vector<std::string>> ReadKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("--api-key-file " + path + ": cannot be read");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find_first_not_of(" \t\r");
    if (a == std::string::npos) continue;
    const size_t b = line.find_last_not_of(" \t\r");
    keys.push_back(line.substr(a, b - a + 1));
  }
  if (keys.empty()) return Status::InvalidArgument("--api-key-file " + path + ": holds no key");
  return keys;
}

}  // namespace

void AddServeCommand(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* serve = app.add_subcommand("serve", "Serve a model over HTTP: OpenAI's API and llama.cpp's server endpoints");
  auto run_options = AddServeRunFlags(serve);
  serve->add_option("--host", f->host, "address to listen on (default 127.0.0.1)");
  serve->add_option("--port", f->port, "port to listen on (default 8080; 0: any free port)");
  serve->add_option("-c,--ctx,--ctx-size", f->ctx,
                    "each slot's context in tokens (default: the model's trained context, at most 4096)");
  serve->add_option("--parallel,--slots", f->slots, "llama-server's -np: slots, conversations kept warm at once (default 4)");
  serve->add_option("--api-key", f->api_keys, "require this key (Authorization: Bearer KEY); repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  serve->add_option("--api-key-file", f->api_key_file, "read the keys from a file, one a line");
  serve->add_option("--session-dir", f->session_dir,
                    "directory where conversations are saved and found again after a restart (default: none)");
  serve->add_option("--queue", f->queue, "requests that may wait; more are answered 503 (default 64)");
  serve->add_option("--alias", f->alias, "the model's id in replies (default: the file's name)");
  serve->callback([f, run_options, &exit_code] {
    const auto usage = [&exit_code](const Status& s) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      exit_code = 2;
    };
    auto run = run_options();
    if (!run.ok()) return usage(run.status());
    server::ServerOptions o;
    o.run = std::move(*run);
    // --ram auto keeps at least the floor: room for warm conversations besides the one a
    // request computes (a run sizes it to its one context).
    o.run.auto_host_floor = kAutoHostFloor;
    o.host = f->host;
    if (f->port < 0 || f->port > 65535) return usage(Status::InvalidArgument("--port must be 0..65535"));
    o.port = f->port;
    if (f->ctx < 0) return usage(Status::InvalidArgument("-c must not be negative (0: the default)"));
    o.n_ctx = f->ctx;
    if (f->slots < 1 || f->slots > 256) return usage(Status::InvalidArgument("-np must be 1..256"));
    o.n_slots = f->slots;
    if (f->queue < 1) return usage(Status::InvalidArgument("--queue must be at least 1"));
    o.max_queue = f->queue;
    o.api_keys = f->api_keys;
    for (const std::string& k : o.api_keys) {
      if (k.empty()) return usage(Status::InvalidArgument("--api-key must not be empty"));
    }
    if (!f->api_key_file.empty()) {
      auto keys = ReadKeys(f->api_key_file);
      if (!keys.ok()) return usage(keys.status());
      o.api_keys.insert(o.api_keys.end(), keys->begin(), keys->end());
    }
    o.session_dir = f->session_dir;
    o.alias = f->alias;
#ifdef TIERKV_VERSION
    o.version = TIERKV_VERSION;
#endif
    if (Status s = server::Serve(std::move(o)); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      exit_code = 1;
    }
  });
}

}  // namespace tierkv
