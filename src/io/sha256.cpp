#include "io/sha256.h"

#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "dschat/core/error.h"

namespace dschat {
namespace io {

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
  bool finished = false;
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  context_->md = EVP_MD_CTX_new();
  DSCHAT_CHECK(context_->md != nullptr && EVP_DigestInit_ex(context_->md, EVP_sha256(), nullptr) == 1,
               Error, "OpenSSL: cannot initialise SHA-256");
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_->md); }

void Sha256::update(const void* data, size_t size) {
  DSCHAT_INTERNAL_ASSERT(!context_->finished, "Sha256 updated after hex()");
  if (size > 0) EVP_DigestUpdate(context_->md, data, size);
}

void Sha256::field(std::string_view name, std::string_view value) {
  update(name.data(), name.size());
  update("=", 1);
  const uint64_t length = value.size();
  update(&length, sizeof(length));
  update(value.data(), value.size());
}

void Sha256::field(std::string_view name, int64_t value) { field(name, std::to_string(value)); }

void Sha256::file(std::string_view name, const std::filesystem::path& file) {
  field(name, sha256_of_file(file));
}

std::string Sha256::hex() {
  DSCHAT_INTERNAL_ASSERT(!context_->finished, "Sha256::hex() called twice");
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  EVP_DigestFinal_ex(context_->md, digest.data(), &size);
  context_->finished = true;
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < size; ++i) {
    out.push_back(kDigits[digest[i] >> 4]);
    out.push_back(kDigits[digest[i] & 15]);
  }
  return out;
}

std::string sha256_of_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  DSCHAT_CHECK(in, IoError, file.string(), ": cannot open for hashing (", std::strerror(errno), ")");
  Sha256 hash;
  std::array<char, 1 << 16> chunk;
  while (in) {
    in.read(chunk.data(), chunk.size());
    hash.update(chunk.data(), static_cast<size_t>(in.gcount()));
  }
  DSCHAT_CHECK(!in.bad(), IoError, file.string(), ": read failed while hashing");
  return hash.hex();
}

}  // namespace io
}  // namespace dschat
