#pragma once
// DeepSpeed-Chat's phase split, bit for bit: `data_split` "a,b,c" assigns disjoint slices of one
// seeded permutation of a dataset's rows to the three training phases (SFT, reward, PPO). The
// permutation is NumPy's legacy RandomState(seed).shuffle (MT19937), so the same seed selects the
// same rows as DeepSpeed-Chat.

#include <cstdint>
#include <string>
#include <vector>

namespace dschat {
namespace data {

/// Parses "2,4,4" into positive weights; throws core::ConfigError naming the string otherwise.
std::vector<double> parse_data_split(const std::string& data_split);

/// Phase boundaries for `size` rows: [0, b1, b2, ..., size], each step Python's round() of the
/// normalised weight times size, the last boundary corrected to `size` by shifting all but the first.
std::vector<int64_t> split_boundaries(const std::vector<double>& weights, int64_t size);

/// numpy.random.RandomState(seed).shuffle(numpy.arange(size)) as a vector.
std::vector<int64_t> numpy_legacy_permutation(uint32_t seed, int64_t size);

/// The rows of phase `phase` (0-based) in permutation order: perm[b[phase] : b[phase + 1]].
std::vector<int64_t> phase_indices(const std::string& data_split, int64_t phase, uint32_t seed, int64_t size);

}  // namespace data
}  // namespace dschat
