// memory/cuda_device_backend_stub.cc
//
// CPU-only builds: there is no CUDA device tier; `--device cuda` says so clearly.
#include "memory/tier_backend.h"

namespace tierkv {

bool CudaDeviceAvailable(std::string* why_not) {
  if (why_not) *why_not = "this tierkv was built without CUDA (TIERKV_WITH_CUDA=OFF)";
  return false;
}

Result<std::unique_ptr<TierBackend>> CreateCudaDeviceBackend(uint64_t, bool) {
  std::string why;
  CudaDeviceAvailable(&why);
  return Status::Unsupported("--device cuda: " + why + "; use --device sim or --device none");
}

Result<CudaCopyRates> MeasureCudaCopies(uint64_t, int) {
  std::string why;
  CudaDeviceAvailable(&why);
  return Status::Unsupported(why);
}

Status RegisterHostMemoryForDevice(std::byte*, uint64_t) {
  return Status::Unsupported("built without CUDA");
}
void UnregisterHostMemoryForDevice(std::byte*) {}

}  // namespace tierkv
