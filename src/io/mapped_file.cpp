#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dschat/core/error.h"

namespace dschat {
namespace io {
namespace {

// Closes the descriptor on every path out of open(); the mapping does not need it.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& file) {
  int fd = -1;
  do {
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  DSCHAT_CHECK(fd >= 0, IoError, file.string(), ": cannot open for reading: ", std::strerror(errno));
  FdGuard guard(fd);

  struct stat st {};
  DSCHAT_CHECK(::fstat(fd, &st) == 0, IoError, file.string(), ": cannot stat: ", std::strerror(errno));
  DSCHAT_CHECK(S_ISREG(st.st_mode), IoError, file.string(), ": not a regular file");
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::shared_ptr<MappedFile>(new MappedFile(file, nullptr, 0));

  // MAP_PRIVATE + PROT_WRITE: in-place updates of aliasing tensors are copy-on-write (see header).
  // MAP_NORESERVE: a writable private mapping would otherwise be charged in full against the
  // overcommit limit, and a checkpoint larger than RAM + swap could not be mapped at all.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  DSCHAT_CHECK(addr != MAP_FAILED, IoError, file.string(), ": cannot mmap ", size,
               " bytes: ", std::strerror(errno));
  return std::shared_ptr<MappedFile>(new MappedFile(file, static_cast<uint8_t*>(addr), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

bool MappedFile::contains(const void* ptr, size_t n) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  auto base = reinterpret_cast<uintptr_t>(data_);
  return data_ != nullptr && p >= base && n <= size_ && p - base <= size_ - n;
}

}  // namespace io
}  // namespace dschat
