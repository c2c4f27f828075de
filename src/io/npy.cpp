// .npy reader and writer (format spec: numpy/lib/format.py, versions 1.0-3.0).
//   "\x93NUMPY" major minor header_len(2 bytes LE in 1.0, 4 in 2.0/3.0) header data
// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
#include "dschat/io/npy.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "dschat/core/error.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace dschat {
namespace io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct NpyType {
  const char* code;  // descr without the byte-order character
  torch::ScalarType dtype;
};
constexpr NpyType kTypes[] = {
    {"f2", torch::kFloat16}, {"f4", torch::kFloat32}, {"f8", torch::kFloat64},
    {"i1", torch::kInt8},    {"i2", torch::kInt16},   {"i4", torch::kInt32},
    {"i8", torch::kInt64},   {"u1", torch::kUInt8},   {"u2", torch::kUInt16},
    {"u4", torch::kUInt32},  {"u8", torch::kUInt64},  {"b1", torch::kBool},
};

struct NpyHeader {
  torch::ScalarType dtype = torch::kFloat;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Strict recursive-descent parser for the one dict literal numpy writes.
class HeaderParser {
 public:
  HeaderParser(const std::string& where, std::string text) : where_(where), text_(std::move(text)) {}

  NpyHeader parse() {
    NpyHeader header;
    std::set<std::string> seen;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = quoted();
      DSCHAT_CHECK(seen.insert(key).second, FormatError, where_, ": header key '", key,
                   "' appears twice");
      expect(':');
      if (key == "descr") {
        header.dtype = descr(quoted());
      } else if (key == "fortran_order") {
        header.fortran_order = boolean();
      } else if (key == "shape") {
        header.shape = shape();
      } else {
        fail("unexpected header key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') ++pos_;
      else if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;  // '}'
    for (; pos_ < text_.size(); ++pos_) {
      if (text_[pos_] != ' ' && text_[pos_] != '\n') fail("unexpected text after the header dict");
    }
    for (const char* key : {"descr", "fortran_order", "shape"}) {
      DSCHAT_CHECK(seen.count(key), FormatError, where_, ": header has no '", key, "' key");
    }
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    DSCHAT_THROW(FormatError, where_, ": malformed header at character ", pos_, ": ", what,
                 " in ", text_.substr(0, 200));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (peek() == ' ') ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string quoted() {
    skip_space();
    char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    size_t end = text_.find(q, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string s = text_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    if (text_.compare(pos_, 4, "True") == 0) return pos_ += 4, true;
    if (text_.compare(pos_, 5, "False") == 0) return pos_ += 5, false;
    fail("expected True or False");
  }
  std::vector<int64_t> shape() {
    std::vector<int64_t> dims;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("expected a non-negative integer dimension");
      int64_t dim = 0;
      while (peek() >= '0' && peek() <= '9') {
        int digit = peek() - '0';
        if (dim > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("dimension overflows int64");
        dim = dim * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long literal
      dims.push_back(dim);
      skip_space();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') fail("expected ',' or ')' in shape");
    }
    ++pos_;  // ')'
    return dims;
  }
  torch::ScalarType descr(const std::string& d) const {
    DSCHAT_CHECK(d.size() == 3, FormatError, where_, ": unsupported dtype descr '", d,
                 "' (supported: <f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1)");
    for (const auto& t : kTypes) {
      if (d.compare(1, 2, t.code) != 0) continue;
      bool one_byte = t.code[1] == '1';
      DSCHAT_CHECK(d[0] != '>' || one_byte, FormatError, where_, ": descr '", d,
                   "' is big-endian; only little-endian .npy files are supported");
      DSCHAT_CHECK(d[0] == '<' || (one_byte && (d[0] == '|' || d[0] == '>')), FormatError, where_,
                   ": descr '", d, "' has byte-order character '", d[0], "', expected '<'",
                   one_byte ? " or '|'" : "");
      return t.dtype;
    }
    DSCHAT_THROW(FormatError, where_, ": unsupported dtype descr '", d,
                 "' (supported: <f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1)");
  }

  const std::string& where_;
  std::string text_;
  size_t pos_ = 0;
};

const char* npy_code(torch::ScalarType dtype) {
  for (const auto& t : kTypes) {
    if (t.dtype == dtype) return t.code;
  }
  return nullptr;
}

}  // namespace

torch::Tensor load_npy(const std::filesystem::path& file) {
  const std::string where = file.string();
  auto map = MappedFile::open(file);
  const uint8_t* p = map->data();
  const size_t size = map->size();
  DSCHAT_CHECK(size >= kMagicSize + 4 && std::memcmp(p, kMagic, kMagicSize) == 0, FormatError,
               where, ": not a .npy file (missing the \\x93NUMPY magic)");
  const int major = p[6];
  DSCHAT_CHECK(major >= 1 && major <= 3, FormatError, where, ": unsupported .npy format version ",
               major, ".", int(p[7]), " (supported: 1.0, 2.0, 3.0)");
  size_t prefix = major == 1 ? 10 : 12;
  DSCHAT_CHECK(size >= prefix, FormatError, where, ": truncated .npy preamble");
  uint64_t header_len = p[8] | (uint64_t{p[9]} << 8);
  if (major > 1) header_len |= (uint64_t{p[10]} << 16) | (uint64_t{p[11]} << 24);
  DSCHAT_CHECK(header_len <= size - prefix, FormatError, where, ": header length ", header_len,
               " exceeds the ", size - prefix, " bytes after the preamble");

  NpyHeader header =
      HeaderParser(where, std::string(reinterpret_cast<const char*>(p + prefix), header_len)).parse();
  const size_t itemsize = c10::elementSize(header.dtype);
  // Strides are products of max(dim, 1): they must fit even when a zero makes the array empty.
  uint64_t numel = 1;
  uint64_t span = 1;
  for (int64_t dim : header.shape) {
    const uint64_t d = std::max<int64_t>(dim, 1);
    DSCHAT_CHECK(span <= (uint64_t{1} << 62) / itemsize / d, FormatError, where, ": shape ",
                 c10::IntArrayRef(header.shape), " is too large");
    span *= d;
    numel *= static_cast<uint64_t>(dim);
  }
  const uint64_t nbytes = numel * itemsize;
  const uint64_t data_start = prefix + header_len;
  DSCHAT_CHECK(size - data_start == nbytes, FormatError, where, ": data has ", size - data_start,
               " bytes, expected ", nbytes, " for shape ", c10::IntArrayRef(header.shape), " of ",
               header.dtype);
  if (header.dtype == torch::kBool) {
    for (uint64_t i = 0; i < nbytes; ++i) {
      DSCHAT_CHECK(p[data_start + i] <= 1, FormatError, where, ": bool element ", i,
                   " has byte value ", int(p[data_start + i]), ", expected 0 or 1");
    }
  }

  // Fortran order is C order of the reversed shape, transposed back.
  std::vector<int64_t> stored_shape = header.shape;
  if (header.fortran_order) std::reverse(stored_shape.begin(), stored_shape.end());
  torch::Tensor out = torch::empty(stored_shape, torch::TensorOptions().dtype(header.dtype));  // [stored_shape...]
  if (nbytes > 0) std::memcpy(out.data_ptr(), p + data_start, nbytes);
  if (header.fortran_order && out.dim() > 1) {
    std::vector<int64_t> reversed_dims(out.dim());
    for (int64_t i = 0; i < out.dim(); ++i) reversed_dims[i] = out.dim() - 1 - i;
    out = out.permute(reversed_dims).contiguous();  // [shape...]
  }
  return out;
}

void save_npy(const std::filesystem::path& file, const torch::Tensor& tensor) {
  const std::string where = file.string();
  DSCHAT_CHECK(tensor.defined(), InvalidArgument, where, ": cannot save an undefined tensor");
  const char* code = npy_code(tensor.scalar_type());
  DSCHAT_CHECK(code != nullptr, InvalidArgument, where, ": dtype ", tensor.scalar_type(),
               " has no NumPy equivalent (convert bfloat16 to float32 first)");
  torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();  // [shape...]

  std::string shape = "(";
  for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
  shape += t.dim() == 1 ? ",)" : ")";
  const char order = code[1] == '1' ? '|' : '<';
  std::string header = std::string("{'descr': '") + order + code +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Padding exactly as numpy.save does, so that both write identical bytes: room for the first
  // dimension to grow to 21 digits, then spaces and a newline up to a 64-byte boundary.
  if (t.dim() > 0) {
    const size_t digits = std::to_string(t.size(0)).size();
    if (digits < 21) header.append(21 - digits, ' ');
  }
  header.append(64 - (kMagicSize + 4 + header.size() + 1) % 64, ' ');
  header += '\n';
  DSCHAT_CHECK(header.size() <= 0xffff, InvalidArgument, where, ": header of ", header.size(),
               " bytes is too long for .npy version 1.0");

  std::string preamble(kMagic, kMagicSize);
  preamble += '\x01';
  preamble += '\x00';
  preamble += static_cast<char>(header.size() & 0xff);
  preamble += static_cast<char>(header.size() >> 8);
  AtomicFileWriter writer(file);
  writer.write(preamble.data(), preamble.size());
  writer.write(header.data(), header.size());
  if (t.nbytes() > 0) writer.write(t.data_ptr(), t.nbytes());
  writer.commit();
}

}  // namespace io
}  // namespace dschat
