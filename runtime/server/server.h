// runtime/server/server.h
//
// `tierkv serve` (docs/server.md): an OpenAI-compatible HTTP server (and llama.cpp's
// server endpoints) over one model whose conversations survive restarts.
//
//   HTTP threads (cpp-httplib)          worker thread (the only one that computes)
//   parse + check + tokenize  --job-->  bounded queue --> pick slot: longest verified
//   reply / SSE frames       <--frames- prefix of the live slots and saved sessions;
//                                       prefill the rest; generate; save the slot
//
// Slots are warm conversations: KV sequences of one KvCache in one MemoryManager, under
// one set of budgets. A request reuses the longest token prefix it shares with a slot
// (tokens compared, never hashes alone) or with a session file saved in --session-dir
// (restored lazily, blocks verified at page-in); a slot whose conversation branches is
// forked copy-on-write. After each reply the slot is saved crash-safe to
// --session-dir, so a restarted server (even after SIGKILL) continues the conversation
// without recomputing it. Requests compute one at a time (a forward pass uses every
// core); the queue holds at most --queue waiting requests, more get 503.
//
// Thread-safety: Start, port, WaitLoaded, Shutdown and Wait may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "memory/status.h"
#include "runtime/run.h"

namespace tierkv::server {

struct ServerOptions {
  // The model, budgets, kernels, KV codec and prefill batch (RunOptions' run fields;
  // the prompt and sampling fields are per request here).
  RunOptions run;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free port (Server::port)
  // Each slot's context in tokens; 0: the model's trained context, at most kDefaultCtx.
  int n_ctx = 0;
  int n_slots = 4;
  std::vector<std::string> api_keys;  // none: no authentication
  std::string session_dir;            // "": conversations are kept in memory only
  int max_queue = 64;                 // waiting requests; more are answered 503
  size_t max_body_bytes = 32u << 20;
  std::string alias;                  // the model's id in replies (default: the file's name)
  std::string version = "dev";        // /props build_info
  int http_threads = 32;
  // SIGTERM / Shutdown: how long the request in flight may take to finish before it is
  // cancelled (what it computed is saved, the client gets what was generated).
  double shutdown_grace_s = 5;
};

inline constexpr int kDefaultCtx = 4096;

class Server {
 public:
  // Binds host:port (an error names it when it cannot) and serves; the model loads in
  // the background (GET /health answers 503 until it has).
  static Result<std::unique_ptr<Server>> Start(ServerOptions options);
  ~Server();

  int port() const;
  // Blocks until the model has loaded (Ok) or failed to (its error).
  Status WaitLoaded();
  // Stops taking requests (503), lets the one in flight finish (or cancels it after
  // shutdown_grace_s, saving what it computed), saves the slots and stops the HTTP
  // server. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `tierkv serve`: starts, logs the address once loaded, and runs until SIGTERM or
// SIGINT (then Shutdown, Ok) or until the model fails to load (its error).
Status Serve(ServerOptions options);

}  // namespace tierkv::server
