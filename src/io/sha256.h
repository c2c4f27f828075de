#pragma once
// SHA-256 (OpenSSL's libcrypto): the tokenised-data cache keys and the checkpoint manifests. Fields
// are added length-prefixed, so two different field lists can never hash the same by shifting
// bytes between neighbours ("ab","c" vs "a","bc").

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace dschat {
namespace io {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  /// Adds raw bytes.
  void update(const void* data, size_t size);
  /// Adds a named field as "name=<8-byte length><bytes>".
  void field(std::string_view name, std::string_view value);
  void field(std::string_view name, int64_t value);
  /// Adds the SHA-256 of a file's contents (not its path: a moved copy hashes the same). Throws
  /// core::IoError naming the file.
  void file(std::string_view name, const std::filesystem::path& file);
  /// The digest as 64 lowercase hex digits; the object cannot be updated afterwards.
  std::string hex();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

/// SHA-256 hex digest of a file's contents, read in chunks. Throws core::IoError naming the file.
std::string sha256_of_file(const std::filesystem::path& file);

}  // namespace io
}  // namespace dschat
