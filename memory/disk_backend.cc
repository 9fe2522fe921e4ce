// memory/disk_backend.cc
//
// Disk tier: one preallocated, unlinked file. Batches are sorted by offset and adjacent
// ops merged into one preadv/pwritev (up to IOV_MAX iovecs), looping on short transfers.
// On a memory filesystem the file is also mapped and transfers are memcpy (see
// DiskBackendOptions::map_memory_fs).
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "memory/fd.h"
#include "memory/size.h"
#include "memory/tier_backend.h"

namespace tierkv {
namespace {

constexpr uint64_t kDirectAlign = 4096;

class DiskBackend final : public TierBackend {
 public:
  DiskBackend(UniqueFd fd, std::string path, uint64_t bytes, bool direct, std::byte* map, double warmup_s)
      : fd_(std::move(fd)), path_(std::move(path)), bytes_(bytes), direct_(direct), map_(map), warmup_s_(warmup_s) {}
  ~DiskBackend() override {
    if (map_ != nullptr) munmap(map_, bytes_);
  }

  Tier tier() const override { return Tier::kDisk; }
  std::string Describe() const override {
    return "disk: " + FormatBytes(bytes_) + " file in " + path_ +
           (map_ != nullptr ? ", mapped" : direct_ ? ", O_DIRECT" : ", buffered");
  }
  uint64_t capacity() const override { return bytes_; }
  // Mapped (a memory filesystem): the CPU reads and writes the arena in place.
  std::byte* base() override { return map_; }
  double warmup_seconds() const override { return warmup_s_; }

  Status Write(std::span<const CopyOp> ops) override { return Transfer(ops, /*write=*/true); }
  Status Read(std::span<const CopyOp> ops) override { return Transfer(ops, /*write=*/false); }

 private:
  Status Transfer(std::span<const CopyOp> ops, bool write) {
    if (map_ != nullptr) {
      for (const CopyOp& op : ops) {
        if (op.offset > bytes_ || op.bytes > bytes_ - op.offset) return Status::InvalidArgument("disk transfer past the arena end");
      }
      for (const CopyOp& op : ops) {
        if (write) {
          std::memcpy(map_ + op.offset, op.host, op.bytes);
        } else {
          std::memcpy(op.host, map_ + op.offset, op.bytes);
        }
      }
      return Status::Ok();
    }
    std::vector<CopyOp> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(), [](const CopyOp& a, const CopyOp& b) { return a.offset < b.offset; });
    std::vector<iovec> iov;
    size_t i = 0;
    while (i < sorted.size()) {
      // Gather a maximal run of file-contiguous ops into one vectored call.
      const uint64_t start = sorted[i].offset;
      uint64_t end = start;
      iov.clear();
      while (i < sorted.size() && sorted[i].offset == end && iov.size() < IOV_MAX) {
        const CopyOp& op = sorted[i];
        if (op.offset > bytes_ || op.bytes > bytes_ - op.offset) return Status::InvalidArgument("disk transfer past the arena end");
        iov.push_back({op.host, op.bytes});
        end += op.bytes;
        ++i;
      }
      TIERKV_RETURN_IF_ERROR(TransferRun(iov, start, end - start, write));
    }
    return Status::Ok();
  }

  Status TransferRun(std::vector<iovec>& iov, uint64_t offset, uint64_t total, bool write) {
    size_t first = 0;
    uint64_t done = 0;
    while (done < total) {
      const int count = static_cast<int>(iov.size() - first);
      const ssize_t n = write ? pwritev(fd_.get(), &iov[first], count, static_cast<off_t>(offset + done))
                              : preadv(fd_.get(), &iov[first], count, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, std::string(write ? "pwrite" : "pread") + " disk tier at offset " +
                                            std::to_string(offset + done) + " (" + path_ + ")");
      }
      if (n == 0) {
        return Status::IoError(std::string(write ? "short write" : "short read") + " on disk tier at offset " +
                               std::to_string(offset + done) + ": " + std::to_string(done) + " of " +
                               std::to_string(total) + " bytes");
      }
      done += static_cast<uint64_t>(n);
      // Advance the iovec window past what was transferred (a short transfer resumes).
      size_t left = static_cast<size_t>(n);
      while (left > 0 && first < iov.size()) {
        if (left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        } else {
          iov[first].iov_base = static_cast<std::byte*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
          left = 0;
        }
      }
    }
    return Status::Ok();
  }

  UniqueFd fd_;
  std::string path_;
  uint64_t bytes_;
  bool direct_;
  std::byte* map_;  // the preallocated file on a memory filesystem; else nullptr
  double warmup_s_;
};

bool OnMemoryFilesystem(int fd) {
  struct statfs s {};
  return fstatfs(fd, &s) == 0 && (s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC);
}

}  // namespace

Result<std::unique_ptr<TierBackend>> CreateDiskBackend(const DiskBackendOptions& options) {
  if (options.bytes == 0) return Status::InvalidArgument("disk tier budget is zero");
  const auto t0 = std::chrono::steady_clock::now();
  struct stat st {};
  if (stat(options.dir.c_str(), &st) != 0) return Status::FromErrno(errno, "disk tier directory " + options.dir);
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument("disk tier directory " + options.dir + " is not a directory");

  std::string tmpl = options.dir + "/tierkv-disk-XXXXXX";
  UniqueFd fd(mkstemp(tmpl.data()));
  if (!fd.valid()) return Status::FromErrno(errno, "disk tier: cannot create a file in " + options.dir);
  unlink(tmpl.c_str());  // anonymous from now on: a crash leaves no arena file behind

  // Only a preallocated file: a fault on a hole of a full tmpfs would be SIGBUS, not ENOSPC.
  const bool map = options.map_memory_fs && options.warmup && OnMemoryFilesystem(fd.get());
  bool direct = false;
  if (!map && options.direct_io && options.bytes % kDirectAlign == 0) {
    // Some filesystems refuse O_DIRECT with EINVAL (tmpfs before Linux 6.6); then stay
    // buffered. Describe() says which mode the tier runs in.
    const int flags = fcntl(fd.get(), F_GETFL);
    direct = flags >= 0 && fcntl(fd.get(), F_SETFL, flags | O_DIRECT) == 0;
  }
  if (options.warmup) {
    const int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(options.bytes));
    if (err != 0) {
      return Status::FromErrno(err, "disk tier: cannot preallocate " + FormatBytes(options.bytes) + " in " + options.dir);
    }
  } else if (ftruncate(fd.get(), static_cast<off_t>(options.bytes)) != 0) {
    const int err = errno;
    return Status::FromErrno(err, "disk tier: cannot size the file in " + options.dir);
  }
  std::byte* mapping = nullptr;
  if (map) {
    void* p = mmap(nullptr, options.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p != MAP_FAILED) mapping = static_cast<std::byte*>(p);  // else pread/pwrite, as on any disk
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::unique_ptr<TierBackend>(
      new DiskBackend(std::move(fd), options.dir, options.bytes, direct, mapping, secs));
}

}  // namespace tierkv
