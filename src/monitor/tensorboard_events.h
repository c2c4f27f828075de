#pragma once
// TensorBoard event files written by hand (no protobuf, no TensorFlow): exactly what TensorBoard's
// scalar dashboard reads.
//
// File: a sequence of TFRecords, each
//   uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
// Data: a serialized tensorflow.Event:
//   1 wall_time double (wire type 1) | 2 step int64 (varint) | 3 file_version string |
//   5 summary Summary { repeated 1 Value { 1 tag string, 2 simple_value float (wire type 5) } }
// The first record of a file is {wall_time, file_version: "brain.Event:2"}.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace monitor {

/// CRC-32C (Castagnoli, reflected 0x82F63B78): crc32c("123456789") == 0xE3069283. `crc` continues
/// a running checksum (start from 0).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
/// TFRecord's masked CRC-32C of `n` bytes.
uint32_t masked_crc32c(const void* data, size_t n);

/// One TFRecord frame around `data`.
std::string tf_record(const std::string& data);

/// Serialized Event holding only wall_time and file_version.
std::string encode_file_version_event(double wall_time, const std::string& file_version = "brain.Event:2");
/// Serialized Event with one summary Value per (tag, simple_value).
std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, float>>& scalars);

/// Appends events to a new file <dir>/events.out.tfevents.<unix seconds>.<hostname> (a numeric
/// suffix is added if that name is taken, e.g. two writers in the same second). Every call is
/// flushed to the OS, so TensorBoard sees it while training runs and a killed run keeps it.
class EventFileWriter {
 public:
  /// Creates `dir` and the file and writes the file_version record. Throws core::IoError.
  explicit EventFileWriter(const std::filesystem::path& dir);

  /// One Event with these scalars (skipped when empty). Throws core::IoError on a failed write.
  void add_scalars(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

  const std::filesystem::path& path() const { return path_; }

 private:
  void append_record(const std::string& event);

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace monitor
}  // namespace dschat
