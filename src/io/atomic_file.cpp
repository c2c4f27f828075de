#include "io/atomic_file.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dschat/core/error.h"

namespace dschat {
namespace io {

AtomicFileWriter::AtomicFileWriter(std::filesystem::path file)
    : file_(std::move(file)), temp_(file_.string() + ".tmp." + std::to_string(::getpid())) {
  do {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  DSCHAT_CHECK(fd_ >= 0, IoError, file_.string(), ": cannot create temp file ", temp_.string(),
               ": ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  close_fd();
  if (!committed_) std::remove(temp_.c_str());
}

void AtomicFileWriter::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void AtomicFileWriter::fail(const char* what, int err) {
  close_fd();
  std::remove(temp_.c_str());
  DSCHAT_THROW(IoError, file_.string(), ": ", what, " failed: ", std::strerror(err));
}

void AtomicFileWriter::write(const void* data, size_t n) {
  DSCHAT_CHECK(fd_ >= 0 && !committed_, IoError, file_.string(), ": write after close");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Large writes are split: Linux transfers at most ~2 GiB per call anyway.
    size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    ssize_t written = ::write(fd_, p, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  DSCHAT_CHECK(fd_ >= 0 && !committed_, IoError, file_.string(), ": commit after close");
  if (::fsync(fd_) != 0) fail("fsync", errno);
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("close", errno);
  if (std::rename(temp_.c_str(), file_.c_str()) != 0) fail("rename", errno);
  committed_ = true;
  // Make the rename itself durable; failure here does not undo the (already visible) file.
  std::filesystem::path dir = file_.parent_path().empty() ? "." : file_.parent_path();
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomically(const std::filesystem::path& file, const std::string& contents) {
  AtomicFileWriter writer(file);
  writer.write(contents.data(), contents.size());
  writer.commit();
}

}  // namespace io
}  // namespace dschat

namespace dschat {
namespace io {
namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path) == 0 ? 0 : errno; }
}  // namespace

void remove_directory_tree(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) return;
  const int err = ::nftw(dir.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  DSCHAT_CHECK(err == 0, IoError, dir.string(), ": cannot remove (", std::strerror(err > 0 ? err : errno), ")");
}

}  // namespace io
}  // namespace dschat
