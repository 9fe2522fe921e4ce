// runtime/runtime_anchor.cc
// Keeps the library non-empty while the runtime grows; holds no code.
namespace tierkv::runtime_anchor {}
