#include "monitor/tensorboard_events.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "dschat/core/error.h"

namespace dschat {
namespace monitor {
namespace {

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

// Protobuf field key: (field number << 3) | wire type.
void put_key(std::string& out, int field, int wire_type) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);  // length-delimited
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double_field(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);  // 64-bit
  put_le(out, bits, 8);
}

void put_float_field(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 5);  // 32-bit
  put_le(out, bits, 4);
}

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tf_record(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

std::string encode_file_version_event(double wall_time, const std::string& file_version) {
  std::string event;
  put_double_field(event, 1, wall_time);
  put_bytes_field(event, 3, file_version);
  return event;
}

std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& scalar : scalars) {
    std::string value;
    put_bytes_field(value, 1, scalar.first);
    put_float_field(value, 2, scalar.second);
    put_bytes_field(summary, 1, value);
  }
  std::string event;
  put_double_field(event, 1, wall_time);
  put_key(event, 2, 0);                        // varint
  put_varint(event, static_cast<uint64_t>(step));  // negative steps: two's complement, 10 bytes
  put_bytes_field(event, 5, summary);
  return event;
}

EventFileWriter::EventFileWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DSCHAT_CHECK(!ec, IoError, dir.string(), ": cannot create the TensorBoard directory: ", ec.message());
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string base =
      "events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host_name();
  path_ = dir / base;
  for (int suffix = 1; std::filesystem::exists(path_); ++suffix) {
    path_ = dir / (base + "." + std::to_string(suffix));
  }
  out_.open(path_, std::ios::binary | std::ios::out | std::ios::trunc);
  DSCHAT_CHECK(out_.is_open(), IoError, path_.string(), ": cannot create the TensorBoard event file: ",
               std::strerror(errno));
  append_record(encode_file_version_event(now));
}

void EventFileWriter::add_scalars(double wall_time, int64_t step,
                                  const std::vector<std::pair<std::string, float>>& scalars) {
  if (scalars.empty()) return;
  append_record(encode_scalars_event(wall_time, step, scalars));
}

void EventFileWriter::append_record(const std::string& event) {
  const std::string record = tf_record(event);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  DSCHAT_CHECK(out_.good(), IoError, path_.string(), ": write failed: ", std::strerror(errno));
}

}  // namespace monitor
}  // namespace dschat
