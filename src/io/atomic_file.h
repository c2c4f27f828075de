#pragma once
// Atomic file replacement: write to "<file>.tmp.<pid>", fsync, rename over <file>, fsync the
// directory. A crash or an error leaves the old file (or none), never a partial one.

#include <cstddef>
#include <filesystem>
#include <string>

namespace dschat {
namespace io {

class AtomicFileWriter {
 public:
  /// Creates the temp file next to `file`. Throws core::IoError naming `file`.
  explicit AtomicFileWriter(std::filesystem::path file);
  /// Removes the temp file unless commit() succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Appends `n` bytes (handles short writes and EINTR). Throws core::IoError naming the file.
  void write(const void* data, size_t n);
  /// fsync + rename over the target + fsync of the directory. Throws core::IoError.
  void commit();

  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const char* what, int err);
  void close_fd();

  std::filesystem::path file_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `contents` to `file` atomically.
void write_file_atomically(const std::filesystem::path& file, const std::string& contents);

}  // namespace io
}  // namespace dschat

namespace dschat {
namespace io {

/// Deletes a directory tree (nftw, depth first). std::filesystem::remove_all is avoided because
/// libtorch.so exports its own copy of it, which crashes when it wins symbol resolution. Missing
/// paths are fine. Throws core::IoError naming the first path it cannot remove.
void remove_directory_tree(const std::filesystem::path& dir);

}  // namespace io
}  // namespace dschat
