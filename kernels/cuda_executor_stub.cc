// kernels/cuda_executor_stub.cc: builds without the CUDA toolkit have no CUDA executor.
#include "kernels/cuda_executor.h"

namespace tierkv::kernels {

std::unique_ptr<Executor> MakeCudaExecutor(std::string* why_not) {
  if (why_not != nullptr) *why_not = "this build has no CUDA executor (built without the CUDA toolkit)";
  return nullptr;
}

}  // namespace tierkv::kernels
