#pragma once
// A whole file mapped into memory (RAII). The mapping is MAP_PRIVATE with PROT_READ|PROT_WRITE:
// writes through it are copy-on-write, stay in this process and never reach the file, so tensors
// that alias the mapping may be updated in place safely. Files written by dschat are replaced by
// rename, never rewritten in place, so a live mapping keeps seeing the old contents; truncating a
// mapped file from outside would still fault (SIGBUS) on access, as with any mmap. The mapping is
// MAP_NORESERVE: pages are only charged once written, so a write after memory ran out faults
// instead of failing the mmap up front.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

namespace dschat {
namespace io {

class MappedFile {
 public:
  /// Maps `file` whole. Throws core::IoError naming the file when it cannot be opened, is not a
  /// regular file or cannot be mapped. An empty file yields size() == 0 and data() == nullptr.
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& file);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

  /// True when [ptr, ptr + n) lies inside the mapping.
  bool contains(const void* ptr, size_t n) const;

 private:
  MappedFile(std::filesystem::path path, uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::filesystem::path path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace io
}  // namespace dschat
