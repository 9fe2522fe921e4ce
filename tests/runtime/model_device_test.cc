// tests/runtime/model_device_test.cc
//
// The decoder's device-executor path, on the CPU. A device executor (the CUDA one)
// cannot read host memory the way the CPU executor does: the decoder must read the
// logits back, stage KV blocks into the compute tier, and hand every compute op only
// memory of the executor's own or pages pinned on the device tier. DeviceStyleExecutor
// computes with the CPU kernels on a simulated device tier but behaves as a device
// executor (host_memory() false) and fails the test when an op gets host memory where
// a GPU would need its own. Runs through it, with paged weights and every KV codec, in
// decode steps and in prefill chunks, must give the CPU executor's logits bit for bit.
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/executor.h"
#include "runtime/builtin_model.h"
#include "runtime/model.h"
#include "memory/faulty_backend.h"
#include "tests/memory/mm_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

using kernels::Executor;

class DeviceStyleExecutor final : public Executor {
 public:
  DeviceStyleExecutor() : cpu_(kernels::MakeCpuExecutor(2)) {}
  // The manager whose device tier counts as this executor's memory.
  void Watch(const MemoryManager* mm) { mm_ = mm; }
  int checked() const { return checked_; }
  // The row counts of the matrices whose weights were host memory.
  const std::set<int64_t>& host_matrices() const { return host_matrices_; }

  // Whether p is in one of this executor's allocations or on the device tier.
  bool Owns(const void* p) const { return Mine(p); }

  const char* name() const override { return "device-style"; }
  int threads() const override { return cpu_->threads(); }
  Tier tier_for(const MemoryManager& mm) const override { return Tier::kDevice; }
  bool host_memory() const override { return false; }

  void* Allocate(size_t bytes) override {
    void* p = cpu_->Allocate(bytes);
    if (p != nullptr) allocs_[static_cast<const std::byte*>(p)] = bytes;
    return p;
  }
  void Deallocate(void* p) override {
    allocs_.erase(static_cast<const std::byte*>(p));
    cpu_->Deallocate(p);
  }
  void Upload(void* dst, const void* src, size_t n) override { Dev(dst, "Upload dst"), cpu_->Upload(dst, src, n); }
  void ReadBack(void* dst, const void* src, size_t n) override { Dev(src, "ReadBack src"), cpu_->ReadBack(dst, src, n); }
  void Copy(void* dst, const void* src, size_t n) override {
    Dev(dst, "Copy dst"), Dev(src, "Copy src"), cpu_->Copy(dst, src, n);
  }
  void WaitFor(const Pin& pin) override { cpu_->WaitFor(pin); }
  void Retire(Pin pin) override { cpu_->Retire(std::move(pin)); }
  void Synchronize() override { cpu_->Synchronize(); }

  void GetRow(const kernels::MatrixView& w, int64_t r, float* out) override { Dev(out, "GetRow"), cpu_->GetRow(w, r, out); }
  void RmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) override {
    Dev(x, "RmsNorm x"), Dev(out, "RmsNorm out"), cpu_->RmsNorm(x, w, rows, n, eps, out);
  }
  void Rope(const kernels::RopeParams& p, int64_t pos, float* x, int n_heads, int head_dim) override {
    Dev(x, "Rope"), cpu_->Rope(p, pos, x, n_heads, head_dim);
  }
  void Add(float* y, const float* x, size_t n) override { Dev(y, "Add y"), cpu_->Add(y, x, n); }  // x: may be a bias
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n) override {
    Dev(gate, "SwiGlu gate"), Dev(up, "SwiGlu up"), Dev(out, "SwiGlu out"), cpu_->SwiGlu(gate, up, out, n);
  }
  void SetActivation(kernels::ActivationRow& row, const float* x, int64_t n) override {
    Dev(x, "SetActivation"), cpu_->SetActivation(row, x, n);
  }
  void MatVec(std::span<const kernels::MatVecJob> jobs) override {
    for (const auto& j : jobs) Dev(j.y, "MatVec y"), Weights(*j.w);
    cpu_->MatVec(jobs);
  }
  void MatMul(std::span<const kernels::MatMulJob> jobs) override {
    for (const auto& j : jobs) Dev(j.y, "MatMul y"), Weights(*j.w);
    cpu_->MatMul(jobs);
  }
  void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) override {
    Dev(logits, "RouteTopK"), cpu_->RouteTopK(logits, n_expert, k, normalize, ids, weights);
  }
  void CombineExperts(const float* weights, const float* rows, int k, int64_t n, float* out) override {
    Dev(rows, "CombineExperts rows"), Dev(out, "CombineExperts out"), cpu_->CombineExperts(weights, rows, k, n, out);
  }
  void AppendKv(const kernels::KvVectorKernels& codec, const kernels::KvWriteSlot& slot, const float* k,
                const float* v) override {
    Dev(slot.k, "AppendKv slot"), Dev(slot.v, "AppendKv slot"), Dev(k, "AppendKv k"), Dev(v, "AppendKv v");
    cpu_->AppendKv(codec, slot, k, v);
  }
  void AttentionBegin(const kernels::KvVectorKernels& codec, const kernels::AttentionParams& p, const float* q,
                      kernels::AttentionState* st) override {
    Dev(q, "AttentionBegin q"), cpu_->AttentionBegin(codec, p, q, st);
  }
  void AttentionStep(const kernels::KvVectorKernels& codec, kernels::AttentionVisit visit,
                     const kernels::AttentionParams& p, const kernels::PagedKvView& kv,
                     kernels::AttentionState* st) override {
    Blocks(kv), cpu_->AttentionStep(codec, visit, p, kv, st);
  }
  void AttentionSoftmax(const kernels::AttentionParams& p, kernels::AttentionState* st) override {
    cpu_->AttentionSoftmax(p, st);
  }
  void AttentionStepMulti(const kernels::KvVectorKernels& codec, kernels::AttentionVisit visit,
                          const kernels::AttentionParams* ps, kernels::AttentionState* const* sts, int64_t n,
                          const kernels::PagedKvView& kv) override {
    Blocks(kv), cpu_->AttentionStepMulti(codec, visit, ps, sts, n, kv);
  }
  void AttentionSoftmaxMulti(const kernels::AttentionParams* ps, kernels::AttentionState* const* sts,
                             int64_t n) override {
    cpu_->AttentionSoftmaxMulti(ps, sts, n);
  }
  void AttentionEnd(const kernels::KvVectorKernels& codec, const kernels::AttentionParams& p,
                    kernels::AttentionState* st, float* out) override {
    Dev(out, "AttentionEnd out"), cpu_->AttentionEnd(codec, p, st, out);
  }

 private:
  bool Mine(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    auto it = allocs_.upper_bound(b);
    if (it != allocs_.begin() && b < std::prev(it)->first + std::prev(it)->second) return true;
    return mm_ != nullptr && mm_->InArena(Tier::kDevice, p);
  }
  // p must be in one of this executor's allocations or on the device tier.
  void Dev(const void* p, const char* what) {
    ++checked_;
    if (p != nullptr && !Mine(p)) ADD_FAILURE() << what << ": host memory where a device executor reads only its own";
  }
  // Weights on the host are constant model data a device executor copies once (the
  // routers, which are read ahead of their layer's page); which ones, for the test.
  void Weights(const kernels::MatrixView& w) {
    ++checked_;
    if (!Mine(w.data)) host_matrices_.insert(w.rows);
  }
  void Blocks(const kernels::PagedKvView& kv) {
    for (int i = 0; i < kv.n_blocks; ++i) Dev(kv.blocks[i], "attention block");
  }

  std::unique_ptr<Executor> cpu_;
  const MemoryManager* mm_ = nullptr;
  std::map<const std::byte*, size_t> allocs_;
  std::set<int64_t> host_matrices_;
  int checked_ = 0;
};

// The host CPU's executor of hybrid experts beside a DeviceStyleExecutor: the CPU
// kernels, failing the test when an op gets memory only the device could read (the
// device executor's allocations, pages on the device tier).
class HostStyleExecutor final : public Executor {
 public:
  HostStyleExecutor(const DeviceStyleExecutor* device) : cpu_(kernels::MakeCpuExecutor(2)), device_(device) {}
  int products() const { return products_; }

  const char* name() const override { return "host-style"; }
  int threads() const override { return cpu_->threads(); }
  Tier tier_for(const MemoryManager& mm) const override { return Tier::kHost; }
  bool host_memory() const override { return true; }
  void* Allocate(size_t bytes) override { return cpu_->Allocate(bytes); }
  void Deallocate(void* p) override { cpu_->Deallocate(p); }
  void Upload(void* dst, const void* src, size_t n) override { Host(dst), Host(src), cpu_->Upload(dst, src, n); }
  void ReadBack(void* dst, const void* src, size_t n) override { Host(dst), Host(src), cpu_->ReadBack(dst, src, n); }
  void Copy(void* dst, const void* src, size_t n) override { Host(dst), Host(src), cpu_->Copy(dst, src, n); }
  void WaitFor(const Pin& pin) override { cpu_->WaitFor(pin); }
  void Retire(Pin pin) override { cpu_->Retire(std::move(pin)); }
  void Synchronize() override { cpu_->Synchronize(); }
  void GetRow(const kernels::MatrixView& w, int64_t r, float* out) override { Host(out), cpu_->GetRow(w, r, out); }
  void RmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) override {
    Host(x), Host(out), cpu_->RmsNorm(x, w, rows, n, eps, out);
  }
  void Rope(const kernels::RopeParams& p, int64_t pos, float* x, int n_heads, int head_dim) override {
    Host(x), cpu_->Rope(p, pos, x, n_heads, head_dim);
  }
  void Add(float* y, const float* x, size_t n) override { Host(y), Host(x), cpu_->Add(y, x, n); }
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n) override {
    Host(gate), Host(up), Host(out), cpu_->SwiGlu(gate, up, out, n);
  }
  void SetActivation(kernels::ActivationRow& row, const float* x, int64_t n) override {
    Host(x), cpu_->SetActivation(row, x, n);
  }
  void MatVec(std::span<const kernels::MatVecJob> jobs) override {
    for (const auto& j : jobs) Host(j.y), Host(j.w->data), ++products_;
    cpu_->MatVec(jobs);
  }
  void MatMul(std::span<const kernels::MatMulJob> jobs) override {
    for (const auto& j : jobs) Host(j.y), Host(j.w->data), ++products_;
    cpu_->MatMul(jobs);
  }
  void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) override {
    Host(logits), cpu_->RouteTopK(logits, n_expert, k, normalize, ids, weights);
  }
  void CombineExperts(const float* weights, const float* rows, int k, int64_t n, float* out) override {
    Host(rows), Host(out), cpu_->CombineExperts(weights, rows, k, n, out);
  }
  void AppendKv(const kernels::KvVectorKernels& codec, const kernels::KvWriteSlot& slot, const float* k,
                const float* v) override {
    ADD_FAILURE() << "the host executor of hybrid experts appended KV";
  }
  void AttentionBegin(const kernels::KvVectorKernels&, const kernels::AttentionParams&, const float*,
                      kernels::AttentionState*) override {
    ADD_FAILURE() << "the host executor of hybrid experts computed attention";
  }
  void AttentionStep(const kernels::KvVectorKernels&, kernels::AttentionVisit, const kernels::AttentionParams&,
                     const kernels::PagedKvView&, kernels::AttentionState*) override {}
  void AttentionSoftmax(const kernels::AttentionParams&, kernels::AttentionState*) override {}
  void AttentionStepMulti(const kernels::KvVectorKernels&, kernels::AttentionVisit, const kernels::AttentionParams*,
                          kernels::AttentionState* const*, int64_t, const kernels::PagedKvView&) override {}
  void AttentionSoftmaxMulti(const kernels::AttentionParams*, kernels::AttentionState* const*, int64_t) override {}
  void AttentionEnd(const kernels::KvVectorKernels&, const kernels::AttentionParams&, kernels::AttentionState*,
                    float*) override {}

 private:
  void Host(const void* p) {
    if (p != nullptr && device_->Owns(p)) ADD_FAILURE() << "device memory given to the host executor";
  }
  std::unique_ptr<Executor> cpu_;
  const DeviceStyleExecutor* device_;
  int products_ = 0;
};

int32_t TokenAt(int pos, int n_vocab) { return static_cast<int32_t>((pos * 7919 + 13) % n_vocab); }

// Logits of every 4th position of a fixed token stream: decode steps (chunks empty) or
// a prefill in chunks cycling through `chunks`. kCpu: the CPU executor on host memory;
// kDeviceStyle: a DeviceStyleExecutor with the weights paged onto a (simulated) device
// tier that holds them all; kCuda: the CUDA executor, weights and KV in VRAM, the device
// tier holding all the weights and `spare_frames` frames more (few: KV blocks and
// weights evicted and fetched again at every step).
// kCpuSim: the CPU executor computing on a simulated device tier (--device sim).
enum class Exec { kCpu, kDeviceStyle, kCuda, kCpuSim };

struct DeviceRun {
  int checked = 0;
  std::set<int64_t> host_matrices;
  int64_t n_expert = 0;
  DecodeCounters counters;
  bool hybrid = false;
  int host_products = 0;  // matrix products the HostStyleExecutor computed
  int n_expert_used = 0;
};

// Hybrid experts: the split, and the device tier's frames: the largest weight page's,
// a share of the other weights' and spare_frames more (share 0: all the weights and
// spare_frames more).
struct Hybrid {
  ModelOptions::ExpertSplit split = ModelOptions::ExpertSplit::kDevice;
  double device_share = 0;
  ExpertSplitRates rates;
  int admit = 1;
};

std::vector<float> Logits(std::shared_ptr<const GgufFile> file, KvCodec codec, Exec kind, int tokens,
                          const std::vector<int>& chunks, DeviceRun* run = nullptr, uint32_t spare_frames = 256,
                          const Hybrid& hybrid = {}) {
  testing::TempDir dir;
  ModelOptions mo;
  mo.threads = 2;
  mo.expert_split = hybrid.split;
  mo.expert_rates = hybrid.rates;
  mo.expert_admit = hybrid.admit;
  const bool device = kind != Exec::kCpu;
  auto exec = std::make_shared<DeviceStyleExecutor>();
  auto host = std::make_shared<HostStyleExecutor>(exec.get());
  if (kind == Exec::kDeviceStyle) mo.executor = exec, mo.host_executor = host;
  if (kind == Exec::kCuda) mo.executor = kernels::MakeExecutor("cuda", 1, nullptr);
  auto model = Model::Load(file, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return {};
  testing::SmallTiers s;
  s.frame_bytes = 64 * 1024;
  const uint32_t weights = static_cast<uint32_t>((*model)->WeightPageBytes(s.frame_bytes) / s.frame_bytes);
  s.device_frames = device ? weights + spare_frames : 0;
  if (device && hybrid.device_share > 0) {
    const uint32_t largest =
        static_cast<uint32_t>(((*model)->LargestWeightPage(s.frame_bytes) + s.frame_bytes - 1) / s.frame_bytes);
    s.device_frames = largest + static_cast<uint32_t>((weights - largest) * hybrid.device_share) + spare_frames;
  }
  s.cuda_device = kind == Exec::kCuda;
  s.host_frames = weights + 256;
  s.disk_frames = 0;
  std::unique_ptr<MemoryManager> mm = testing::MakeManager(s, dir.path());
  exec->Watch(mm.get());
  if (device) {
    const Status st = (*model)->UseMemory(mm.get());
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  auto cache = KvCache::Create(mm.get(), (*model)->KvGeometryFor(codec, /*block_tokens=*/16));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  const SeqId seq = (*cache)->NewSequence();
  const int n_vocab = (*model)->config().n_vocab;
  std::vector<float> all, logits(static_cast<size_t>(n_vocab));
  size_t c = 0;
  for (int pos = 0; pos < tokens;) {
    if (chunks.empty()) {
      const Status st = (*model)->Forward(**cache, seq, TokenAt(pos, n_vocab), pos, logits);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (pos % 4 == 3) all.insert(all.end(), logits.begin(), logits.end());
      ++pos;
      continue;
    }
    const int n = std::min(chunks[c++ % chunks.size()], tokens - pos);
    std::vector<int32_t> ids;
    std::vector<int> rows;
    for (int i = 0; i < n; ++i) {
      ids.push_back(TokenAt(pos + i, n_vocab));
      if ((pos + i) % 4 == 3) rows.push_back(i);
    }
    logits.resize(rows.size() * static_cast<size_t>(n_vocab));
    const Status st = (*model)->ForwardBatch(**cache, seq, ids, pos, rows, logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    all.insert(all.end(), logits.begin(), logits.end());
    pos += n;
  }
  if (run != nullptr) {
    *run = {exec->checked(),           exec->host_matrices(),   (*model)->config().n_expert,
            (*model)->counters(),      (*model)->hybrid_experts(), host->products(),
            (*model)->config().n_expert_used};
  }
  cache->reset();
  model->reset();  // before the memory manager
  return all;
}

TEST(ModelDeviceTest, DeviceExecutorPathGivesTheCpuLogits) {
  std::vector<std::pair<std::string, std::shared_ptr<const GgufFile>>> models;
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  models.emplace_back("builtin:tiny-moe", std::move(tiny).value());
  const std::string ref = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-llama-q8_0.gguf";
  if (std::filesystem::exists(ref)) {
    auto f = GgufFile::Open(ref);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    models.emplace_back("ref-llama-q8_0", std::move(f).value());
  } else {
    ASSERT_FALSE(testing::ReferenceRequired()) << ref << " is absent and TIERKV_REQUIRE_REFERENCE is set";
  }
  for (const auto& [name, file] : models) {
    for (KvCodec codec : kAllKvCodecs) {
      for (const std::vector<int>& chunks : {std::vector<int>{}, std::vector<int>{9, 2, 13}}) {
        SCOPED_TRACE(name + " " + KvCodecName(codec) + (chunks.empty() ? ", decode" : ", prefill chunks"));
        DeviceRun run;
        const std::vector<float> cpu = Logits(file, codec, Exec::kCpu, 40, chunks);
        const std::vector<float> dev = Logits(file, codec, Exec::kDeviceStyle, 40, chunks, &run);
        ASSERT_FALSE(cpu.empty());
        ASSERT_EQ(cpu.size(), dev.size());
        EXPECT_EQ(std::memcmp(cpu.data(), dev.data(), cpu.size() * sizeof(float)), 0)
            << "the device path changed the logits";
        EXPECT_GT(run.checked, 1000) << "the ops went through the checks";
        // Every weight matrix on the device but the routers (n_expert rows).
        for (int64_t rows : run.host_matrices) {
          EXPECT_EQ(rows, run.n_expert) << "a matrix of " << rows << " rows on the host";
        }
      }
    }
  }
}

// Hybrid experts (docs/gpu.md): with a device tier holding a share of the weights, the
// experts it holds compute on the device and the others on the host CPU from the host
// tier (kHost), or some are copied as the cost model chooses (kAuto, its copy rate
// made comparable to the host's so that both sides get work). The logits are the
// all-resident CPU run's bit for bit, in decode steps and prefill chunks, at every
// share; the host executor is never handed device memory; the counters add up.
TEST(ModelDeviceTest, HybridExpertsGiveTheAllResidentLogits) {
  std::vector<std::pair<std::string, std::shared_ptr<const GgufFile>>> models;
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  models.emplace_back("builtin:tiny-moe", std::move(tiny).value());
  const std::string ref = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-q8_0.gguf";
  if (std::filesystem::exists(ref)) {
    auto f = GgufFile::Open(ref);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    models.emplace_back("ref-qwen3moe-q8_0", std::move(f).value());
  } else {
    ASSERT_FALSE(testing::ReferenceRequired()) << ref << " is absent and TIERKV_REQUIRE_REFERENCE is set";
  }
  using Split = ModelOptions::ExpertSplit;
  for (const auto& [name, file] : models) {
    for (const std::vector<int>& chunks : {std::vector<int>{}, std::vector<int>{9, 2, 13}}) {
      const std::vector<float> cpu = Logits(file, KvCodec::kQ8_0, Exec::kCpu, 40, chunks);
      ASSERT_FALSE(cpu.empty());
      for (Exec kind : {Exec::kCpuSim, Exec::kDeviceStyle}) {
        for (double share : {0.2, 0.5, 0.0}) {
          for (Split split : {Split::kHost, Split::kAuto}) {
            SCOPED_TRACE(name + (chunks.empty() ? ", decode" : ", prefill chunks") +
                         (kind == Exec::kCpuSim ? ", sim" : ", device-style") + ", device share " +
                         std::to_string(share) + (split == Split::kHost ? ", host" : ", auto"));
            Hybrid hybrid{split, share, {}};
            hybrid.rates.copy = 2e9;
            hybrid.rates.host = 2e9;
            hybrid.rates.host_token = 2e9;
            DeviceRun run;
            const std::vector<float> dev = Logits(file, KvCodec::kQ8_0, kind, 40, chunks, &run, 32, hybrid);
            ASSERT_EQ(cpu.size(), dev.size());
            EXPECT_EQ(std::memcmp(cpu.data(), dev.data(), cpu.size() * sizeof(float)), 0)
                << "hybrid experts changed the logits";
            const DecodeCounters& d = run.counters;
            EXPECT_TRUE(run.hybrid);
            EXPECT_EQ(d.experts_on_device + d.experts_on_host, d.expert_acquires);
            EXPECT_LE(d.experts_copied, d.experts_on_device);
            // The device starts empty: its first experts are misses, and with kHost all of
            // them compute on the host, which admits some. (With kAuto the split follows
            // measured rates, and a host expert's page may reach the device with a copied
            // expert sharing it, leaving nothing to admit: no count is certain.)
            if (split == Split::kHost) {
              EXPECT_GT(d.experts_on_host, 0u);
              EXPECT_GT(d.experts_admitted, 0u);
            }
            if (kind == Exec::kDeviceStyle && d.experts_on_host > 0) {
              EXPECT_GT(run.host_products, 0);
            }
            // With every expert fitting, the admissions make later tokens' experts hits.
            if (share == 0.0) {
              EXPECT_GT(d.expert_hits, 0u);
            }
          }
        }
      }
    }
  }
}

// Placement: with every miss on the host, experts reach the device only as admissions,
// at most expert_admit per MoE layer and step; none admitted, the device never holds an
// expert (every acquire a miss, computed on the host); more admitted, more hits. The
// logits never change.
TEST(ModelDeviceTest, HybridAdmissionsFollowTheirBudget) {
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  std::shared_ptr<const GgufFile> file = std::move(tiny).value();
  const std::vector<float> cpu = Logits(file, KvCodec::kF16, Exec::kCpu, 40, {});
  ASSERT_FALSE(cpu.empty());
  uint64_t last_hits = 0;
  for (int admit : {0, 1, 3}) {
    SCOPED_TRACE("admit " + std::to_string(admit));
    Hybrid hybrid;
    hybrid.split = ModelOptions::ExpertSplit::kHost;
    hybrid.admit = admit;
    DeviceRun run;
    const std::vector<float> dev = Logits(file, KvCodec::kF16, Exec::kCpuSim, 40, {}, &run, 64, hybrid);
    ASSERT_EQ(dev.size(), cpu.size());
    EXPECT_EQ(std::memcmp(cpu.data(), dev.data(), cpu.size() * sizeof(float)), 0);
    const DecodeCounters& d = run.counters;
    const uint64_t layer_steps = d.expert_acquires / static_cast<uint64_t>(run.n_expert_used);
    EXPECT_LE(d.experts_admitted, static_cast<uint64_t>(admit) * layer_steps);
    EXPECT_EQ(d.experts_copied, 0u);
    if (admit == 0) {
      EXPECT_EQ(d.experts_admitted, 0u);
      EXPECT_EQ(d.expert_hits, 0u);
      EXPECT_EQ(d.experts_on_host, d.expert_acquires);
    } else {
      EXPECT_GT(d.experts_admitted, 0u);
      EXPECT_GT(d.expert_hits, last_hits);
    }
    last_hits = d.expert_hits;
  }
}

// Faults on the device's copies under hybrid experts (an admission, a copied miss, a
// layer page failing to land: EIO on the n-th copy into the device, or a copy failing
// midway): a step either fails with an error naming the copy, leaving the sequence as
// it was, or gives the logits of the all-resident run; never other logits. Decode steps
// go on after a failed one (the same token again).
TEST(ModelDeviceTest, HybridExpertsSurviveDeviceCopyFaults) {
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  std::shared_ptr<const GgufFile> file = std::move(tiny).value();
  constexpr int kTokens = 24;
  const std::vector<float> cpu = Logits(file, KvCodec::kF16, Exec::kCpu, kTokens, {});
  ASSERT_FALSE(cpu.empty());
  int failed_steps = 0;
  for (Fault fault : {Fault::kEioOnWrite, Fault::kFailMidway}) {
    for (int skip : {0, 3, 11, 25, 40}) {
      SCOPED_TRACE(std::string(FaultName(fault)) + " after " + std::to_string(skip) + " copies");
      testing::TempDir dir;
      ModelOptions mo;
      mo.threads = 2;
      mo.expert_split = ModelOptions::ExpertSplit::kAuto;
      mo.expert_rates.copy = 2e9;
      mo.expert_rates.host = 2e9;
      auto model = Model::Load(file, mo);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      testing::SmallTiers s;
      s.frame_bytes = 64 * 1024;
      const uint32_t weights = static_cast<uint32_t>((*model)->WeightPageBytes(s.frame_bytes) / s.frame_bytes);
      const uint32_t largest = static_cast<uint32_t>(((*model)->LargestWeightPage(s.frame_bytes) + s.frame_bytes - 1) /
                                                     s.frame_bytes);
      s.device_frames = largest + (weights - largest) / 3 + 32;
      s.host_frames = weights + 256;
      s.disk_frames = 0;
      auto faults = std::make_shared<FaultInjector>();
      std::unique_ptr<MemoryManager> mm = testing::MakeManager(s, dir.path(), faults);
      ASSERT_TRUE((*model)->UseMemory(mm.get()).ok());
      ASSERT_TRUE((*model)->hybrid_experts());
      auto cache = KvCache::Create(mm.get(), (*model)->KvGeometryFor(KvCodec::kF16, /*block_tokens=*/16));
      ASSERT_TRUE(cache.ok()) << cache.status().ToString();
      const SeqId seq = (*cache)->NewSequence();
      const int n_vocab = (*model)->config().n_vocab;
      std::vector<float> logits(static_cast<size_t>(n_vocab));
      faults->Arm(fault, skip);
      size_t compared = 0;
      for (int pos = 0, tries = 0; pos < kTokens && tries < 4 * kTokens; ++tries) {
        const Status st = (*model)->Forward(**cache, seq, TokenAt(pos, n_vocab), pos, logits);
        if (!st.ok()) {
          ++failed_steps;
          EXPECT_FALSE(st.ToString().empty());
          EXPECT_EQ((*cache)->Length(seq), pos) << "a failed step left its token in the cache";
          continue;  // the one-shot fault has fired: the same token again
        }
        if (pos % 4 == 3) {
          EXPECT_EQ(std::memcmp(logits.data(), cpu.data() + compared, logits.size() * sizeof(float)), 0)
              << "other logits at position " << pos;
          compared += logits.size();
        }
        ++pos;
      }
      EXPECT_EQ(compared, cpu.size()) << "the run did not finish";
      EXPECT_EQ(faults->fired(), 1);
      cache->reset();
      model->reset();
    }
  }
  // Some of the faults hit a copy a step waited for (the others, background admissions).
  EXPECT_GT(failed_steps, 0);
}

// On a GPU: the CUDA executor's logits do not depend on the device budget (ample, or a
// few frames beyond the weights, so KV blocks are evicted and fetched at every step),
// on decode steps vs prefill chunks of any size (its products and attention are per
// token, its attention folded block by block), for every KV type it takes.
TEST(ModelDeviceTest, CudaLogitsDoNotDependOnBudgetsOrChunks) {
  std::string why;
  if (kernels::MakeExecutor("cuda", 1, &why) == nullptr) GTEST_SKIP() << "no CUDA executor: " << why;
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  std::shared_ptr<const GgufFile> file = std::move(tiny).value();
  for (KvCodec codec : {KvCodec::kF16, KvCodec::kQ8_0, KvCodec::kQ4_0}) {
    SCOPED_TRACE(KvCodecName(codec));
    const std::vector<float> ample = Logits(file, codec, Exec::kCuda, 200, {});
    ASSERT_FALSE(ample.empty());
    for (const auto& [chunks, spare] : {std::pair<std::vector<int>, uint32_t>{{}, 4}, {{9, 2, 13}, 256},
                                        {{64}, 256}, {{7, 64}, 4}}) {
      const std::vector<float> other = Logits(file, codec, Exec::kCuda, 200, chunks, nullptr, spare);
      ASSERT_EQ(other.size(), ample.size());
      EXPECT_EQ(std::memcmp(other.data(), ample.data(), ample.size() * sizeof(float)), 0)
          << chunks.size() << " chunk sizes, " << spare << " spare device frames: other logits";
    }
  }
}

}  // namespace
}  // namespace tierkv
