// kernels/cuda_executor.h
//
// The CUDA executor (kernels/cuda_executor.cu): the ops of kernels/executor.h on one
// NVIDIA GPU, on a stream of its own, over memory on the device tier (a MemoryManager
// built with DeviceKind::kCuda) and its own cudaMalloc'd arrays. Numerics (docs/gpu.md):
//   exact class - activation quantization, the matrix products over the quantized types,
//     RoPE, CombineExperts, the KV encoders: the CPU kernels' bits (the shared host/device
//     definitions of kernels/quant_hd.h, kernels/kv_layout_hd.h);
//   tolerance class - RMSNorm, SwiGLU, attention (f16, q8_0, q4_0 KV; per-block partials
//     merged in block order, so the bits depend neither on how blocks are batched nor on
//     where they were paged from), the float weight types' products.
// RouteTopK reads the router logits back and routes on the host (the CPU's bits).
// Operands the decoder passes as host pointers (norm weights, biases: constant model
// data) are copied to the device once and kept.
//
// This header names no CUDA type; builds without CUDA link cuda_executor_stub.cc.
#pragma once

#include <memory>
#include <string>

#include "kernels/executor.h"

namespace tierkv::kernels {

// A CUDA executor on device 0, or null with *why_not set (this build has no CUDA, or no
// device answers).
std::unique_ptr<Executor> MakeCudaExecutor(std::string* why_not);

}  // namespace tierkv::kernels
