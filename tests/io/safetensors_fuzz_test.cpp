// Seeded mutation fuzzing of load_safetensors: every mutated file either loads, with every
// tensor's bytes equal to the file bytes its entry names, or throws a dschat::core::Error.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <random>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/io_cases.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

using Json = nlohmann::json;

struct Parts {
  Json header;
  std::string data;
};

Parts split(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return {Json::parse(file.substr(8, n)), file.substr(8 + n)};
}

std::string join(const std::string& header_text, const std::string& data, bool pad) {
  std::string header = header_text;
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return testing::safetensors_bytes(header, data);
}

class Mutator {
 public:
  Mutator(const std::string& valid, uint64_t seed) : valid_(valid), rng_(seed) {}

  std::string mutate() {
    std::string out = valid_;
    int rounds = pick(0, 4) == 0 ? 2 : 1;
    for (int r = 0; r < rounds; ++r) out = mutate_once(out);
    return out;
  }

 private:
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

  Json random_number() {
    switch (pick(0, 8)) {
      case 0: return -1;
      case 1: return 0;
      case 2: return int64_t{1} << 62;
      case 3: return std::numeric_limits<int64_t>::max();
      case 4: return std::numeric_limits<uint64_t>::max();
      case 5: return 1e30;
      case 6: return -pick(1, 1000);
      case 7: return "12";
      default: return pick(0, 64);
    }
  }

  std::string mutate_once(const std::string& file) {
    if (file.size() < 8) return file;
    uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    const bool header_ok = n <= file.size() - 8;
    switch (pick(0, 8)) {
      case 0: {  // flip or overwrite a few header bytes
        std::string out = file;
        uint64_t end = header_ok ? 8 + n : out.size();
        for (int i = pick(1, 4); i > 0 && end > 8; --i) {
          size_t at = static_cast<size_t>(pick(8, static_cast<int64_t>(end) - 1));
          out[at] = pick(0, 1) ? static_cast<char>(out[at] ^ (1 << pick(0, 7)))
                               : "{}[]\",:-0123456789eE. \x80\xff"[pick(0, 24)];
        }
        return out;
      }
      case 1: {  // rewrite the length field
        uint64_t v = pick(0, 2) == 0 ? rng_() : n + pick(-16, 16);
        std::string out = file;
        for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
        return out;
      }
      case 2: return file.substr(0, static_cast<size_t>(pick(0, static_cast<int64_t>(file.size()) - 1)));
      case 3: {  // random bytes in the data section (BOOL tensors may become invalid)
        std::string out = file;
        if (header_ok && out.size() > 8 + n) {
          for (int i = pick(1, 8); i > 0; --i) out[pick(8 + n, out.size() - 1)] = static_cast<char>(rng_());
        }
        return out;
      }
      default: return mutate_json(file, header_ok);
    }
  }

  std::string mutate_json(const std::string& file, bool header_ok) {
    Parts parts;
    try {
      if (!header_ok) return file;
      parts = split(file);
    } catch (const Json::exception&) {
      return file;  // an earlier round broke the JSON already
    }
    std::vector<std::string> names;
    for (auto& [name, value] : parts.header.items()) {
      if (name != "__metadata__" && value.is_object()) names.push_back(name);
    }
    if (names.empty()) return file;
    const std::string name = names[pick(0, names.size() - 1)];
    Json& entry = parts.header[name];
    std::string text;
    switch (pick(0, 5)) {
      case 0: {
        const Json dtypes[] = {"F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "F8_E4M3", "XX", "", 7, nullptr};
        entry["dtype"] = dtypes[pick(0, 11)];
        break;
      }
      case 1: {
        Json& shape = entry["shape"];
        if (!shape.is_array()) break;
        int what = static_cast<int>(pick(0, 2));
        if (what == 0 && !shape.empty()) shape[pick(0, shape.size() - 1)] = random_number();
        if (what == 1) shape.push_back(random_number());
        if (what == 2 && !shape.empty()) shape.erase(shape.size() - 1);
        break;
      }
      case 2: {
        Json& offsets = entry["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2) break;
        int what = static_cast<int>(pick(0, 2));
        if (what == 0) offsets[pick(0, 1)] = random_number();
        if (what == 1) std::swap(offsets[0], offsets[1]);
        if (what == 2) {  // overlap: take another tensor's range
          offsets = parts.header[names[pick(0, names.size() - 1)]]["data_offsets"];
        }
        break;
      }
      case 3: {  // duplicate an entry textually (JSON objects cannot hold it)
        text = parts.header.dump();
        std::string copy = Json(name).dump() + ":" + entry.dump() + ",";
        text.insert(1, copy);
        break;
      }
      case 4: entry.erase(pick(0, 1) ? "shape" : "dtype"); break;
      default: parts.header["__metadata__"] = pick(0, 1) ? Json{{"k", 1}} : Json{{"k", "v"}}; break;
    }
    if (text.empty()) text = parts.header.dump();
    return join(text, parts.data, pick(0, 3) != 0);
  }

  std::string valid_;
  std::mt19937_64 rng_;
};

// A loaded file is consistent: each tensor equals the bytes its entry names, inside the file.
void check_loaded(const std::string& bytes, const TensorMap& tensors) {
  Parts parts = split(bytes);  // must parse: the loader accepted it
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  for (const auto& [name, t] : tensors) {
    const Json& offsets = parts.header.at(name).at("data_offsets");
    uint64_t begin = offsets[0].get<uint64_t>();
    uint64_t end = offsets[1].get<uint64_t>();
    ASSERT_LE(begin, end) << name;
    ASSERT_LE(8 + n + end, bytes.size()) << name;
    ASSERT_EQ(static_cast<uint64_t>(t.nbytes()), end - begin) << name;
    if (t.nbytes() > 0) {
      ASSERT_EQ(std::memcmp(t.data_ptr(), bytes.data() + 8 + n + begin, end - begin), 0) << name;
    }
  }
}

TEST(SafetensorsFuzz, RandomHeaderMutations) {
  testing::TempDir dir;
  const auto valid_file = dir / "valid.safetensors";
  save_safetensors(valid_file,
                   {{"a.weight", torch::randn({3, 4})},
                    {"b.half", torch::randn({5}).to(torch::kFloat16)},
                    {"c.long", torch::arange(4, torch::kInt64).reshape({2, 2})},
                    {"d.bytes", torch::arange(3, torch::kUInt8)},
                    {"e.mask", torch::tensor({true, false, true, true})},
                    {"f.empty", torch::zeros({0, 2}, torch::kBFloat16)},
                    {"g.scalar", torch::tensor(int8_t{-3})}},
                   {{"format", "pt"}});
  const std::string valid = testing::read_bytes(valid_file);
  const auto file = dir / "mutant.safetensors";

  int loaded = 0;
  int rejected = 0;
  constexpr int kCases = 3000;
  for (int i = 0; i < kCases; ++i) {
    std::string bytes = Mutator(valid, 0x5eed0000u + i).mutate();
    testing::write_bytes(file, bytes);
    try {
      TensorMap tensors = load_safetensors(file);
      ++loaded;
      check_loaded(bytes, tensors);
      if (::testing::Test::HasFatalFailure()) FAIL() << "case " << i;
    } catch (const core::Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "case " << i << ": non-dschat exception: " << e.what();
    }
  }
  std::cout << "[fuzz] " << kCases << " cases: " << loaded << " loaded, " << rejected << " rejected\n";
  EXPECT_GT(loaded, kCases / 20);
  EXPECT_GT(rejected, kCases / 4);
}

}  // namespace
}  // namespace io
}  // namespace dschat
