#include "dschat/data/split.h"

#include <array>
#include <cfenv>
#include <cmath>
#include <sstream>

#include "dschat/core/error.h"

namespace dschat {
namespace data {
namespace {

// MT19937 with NumPy's legacy integer seeding (init_genrand) and 32-bit output.
class Mt19937 {
 public:
  explicit Mt19937(uint32_t seed) {
    state_[0] = seed;
    for (uint32_t i = 1; i < kSize; ++i) state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
    position_ = kSize;
  }

  uint32_t next32() {
    if (position_ >= kSize) regenerate();
    uint32_t y = state_[position_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
  }

  uint64_t next64() {  // NumPy: high word first
    uint64_t high = next32();
    return (high << 32) | next32();
  }

 private:
  static constexpr uint32_t kSize = 624, kShift = 397;
  void regenerate() {
    for (uint32_t i = 0; i < kSize; ++i) {
      uint32_t y = (state_[i] & 0x80000000u) | (state_[(i + 1) % kSize] & 0x7fffffffu);
      state_[i] = state_[(i + kShift) % kSize] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    position_ = 0;
  }
  std::array<uint32_t, kSize> state_{};
  uint32_t position_;
};

// NumPy's random_interval: a uniform integer in [0, max] by masked rejection sampling.
uint64_t random_interval(Mt19937& rng, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift : {1, 2, 4, 8, 16, 32}) mask |= mask >> shift;
  uint64_t value;
  if (max <= 0xffffffffull) {
    while ((value = (rng.next32() & mask)) > max) {
    }
  } else {
    while ((value = (rng.next64() & mask)) > max) {
    }
  }
  return value;
}

}  // namespace

std::vector<double> parse_data_split(const std::string& data_split) {
  std::vector<double> weights;
  std::stringstream stream(data_split);
  std::string part;
  while (std::getline(stream, part, ',')) {
    size_t used = 0;
    double value = -1;
    try {
      value = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSCHAT_CHECK(used == part.size() && used > 0 && value >= 0 && std::isfinite(value), ConfigError,
                 "data_split '", data_split, "': '", part, "' is not a non-negative number");
    weights.push_back(value);
  }
  double total = 0;
  for (double w : weights) total += w;
  DSCHAT_CHECK(!weights.empty() && total > 0, ConfigError, "data_split '", data_split,
               "': expected comma-separated weights with a positive sum, e.g. \"2,4,4\"");
  return weights;
}

std::vector<int64_t> split_boundaries(const std::vector<double>& weights, int64_t size) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<int64_t> bounds = {0};
  std::fesetround(FE_TONEAREST);  // Python's round(): half to even
  for (double w : weights) bounds.push_back(bounds.back() + static_cast<int64_t>(std::nearbyint(w / total * size)));
  int64_t diff = bounds.back() - size;
  for (size_t i = 1; i < bounds.size(); ++i) bounds[i] -= diff;
  return bounds;
}

std::vector<int64_t> numpy_legacy_permutation(uint32_t seed, int64_t size) {
  std::vector<int64_t> perm(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) perm[i] = i;
  Mt19937 rng(seed);
  for (int64_t i = size - 1; i >= 1; --i) {
    auto j = static_cast<int64_t>(random_interval(rng, static_cast<uint64_t>(i)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

std::vector<int64_t> phase_indices(const std::string& data_split, int64_t phase, uint32_t seed, int64_t size) {
  std::vector<double> weights = parse_data_split(data_split);
  DSCHAT_CHECK(phase >= 0 && phase < static_cast<int64_t>(weights.size()), InvalidArgument, "data_split '",
               data_split, "' has ", weights.size(), " phases; phase index ", phase, " is out of range");
  DSCHAT_CHECK(size >= 0, InvalidArgument, "data split: dataset size must be >= 0, got ", size);
  std::vector<int64_t> bounds = split_boundaries(weights, size);
  std::vector<int64_t> perm = numpy_legacy_permutation(seed, size);
  return {perm.begin() + bounds[phase], perm.begin() + bounds[phase + 1]};
}

}  // namespace data
}  // namespace dschat
