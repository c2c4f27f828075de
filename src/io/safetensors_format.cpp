#include "io/safetensors_format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "dschat/core/error.h"

namespace dschat {
namespace io {
namespace {

struct DtypeName {
  const char* name;
  torch::ScalarType dtype;
};

// Every dtype of the safetensors spec that LibTorch has (complex and sub-byte types are not).
constexpr DtypeName kDtypes[] = {
    {"F64", torch::kFloat64},         {"F32", torch::kFloat32},      {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16},       {"I64", torch::kInt64},        {"I32", torch::kInt32},
    {"I16", torch::kInt16},           {"I8", torch::kInt8},          {"U64", torch::kUInt64},
    {"U32", torch::kUInt32},          {"U16", torch::kUInt16},       {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},           {"F8_E4M3", torch::kFloat8_e4m3fn},
    {"F8_E5M2", torch::kFloat8_e5m2},
};

const DtypeName* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// A short rendering of a JSON value for messages; never recurses into deep input (a hostile
// header may nest arrays a million levels deep and dump() is recursive).
std::string brief(const nlohmann::json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    return s.size() <= 64 ? nlohmann::json(s).dump() : nlohmann::json(s.substr(0, 64)).dump() + "...";
  }
  if (v.is_primitive()) return v.dump();
  if (v.is_array()) {
    bool flat = v.size() <= 8 && std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) {
                  return e.is_number() || e.is_boolean() || e.is_null();
                });
    return flat ? v.dump() : "an array of " + std::to_string(v.size()) + " elements";
  }
  return "an object with " + std::to_string(v.size()) + " keys";
}

// A JSON number that is an integer in [0, 2^63) (doubles and negatives are rejected).
bool as_index(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
  } else {
    return false;
  }
  return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

// Parses with a callback that records the first duplicated key of any object: nlohmann would
// silently keep the last one, and two entries for one tensor make the file ambiguous.
nlohmann::json parse_json(const std::string& where, const char* first, const char* last) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Event::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(first, last, callback);
  } catch (const nlohmann::json::exception& e) {
    DSCHAT_THROW(FormatError, where, ": header is not valid JSON: ", e.what());
  }
  DSCHAT_CHECK(duplicate.empty(), FormatError, where, ": header has the key '", duplicate,
               "' more than once");
  return header;
}

Metadata parse_metadata(const std::string& where, const nlohmann::json& value) {
  DSCHAT_CHECK(value.is_object(), FormatError, where,
               ": '__metadata__' must be an object of strings, got ", brief(value));
  Metadata metadata;
  for (auto it = value.begin(); it != value.end(); ++it) {
    DSCHAT_CHECK(it.value().is_string(), FormatError, where, ": '__metadata__' key '", it.key(),
                 "' must be a string, got ", brief(it.value()));
    metadata[it.key()] = it.value().get<std::string>();
  }
  return metadata;
}

SafetensorsEntry parse_entry(const std::string& where, const std::string& name,
                             const nlohmann::json& value, uint64_t data_size) {
  std::string at = where + ": tensor '" + name + "'";
  DSCHAT_CHECK(value.is_object(), FormatError, at, ": entry must be an object, got ", brief(value));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    DSCHAT_CHECK(value.contains(key), FormatError, at, ": entry has no '", key, "'");
  }
  SafetensorsEntry entry;
  entry.name = name;

  const auto& dtype = value["dtype"];
  DSCHAT_CHECK(dtype.is_string(), FormatError, at, ": 'dtype' must be a string, got ", brief(dtype));
  const DtypeName* known = find_dtype(dtype.get<std::string>());
  DSCHAT_CHECK(known != nullptr, FormatError, at, ": unknown dtype ", brief(dtype), " (supported: ",
               safetensors_supported_dtypes(), ")");
  entry.dtype = known->dtype;

  const auto& shape = value["shape"];
  DSCHAT_CHECK(shape.is_array(), FormatError, at, ": 'shape' must be an array, got ", brief(shape));
  // Overflow checks as LibTorch needs them: the contiguous strides are products of max(dim, 1),
  // so they must fit in int64 even when a zero dimension makes the tensor empty.
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t numel = 1;
  uint64_t span = 1;  // product of max(dim, 1) >= numel
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t dim = 0;
    DSCHAT_CHECK(as_index(shape[i], &dim), FormatError, at, ": shape[", i,
                 "] must be an integer in [0, 2^63), got ", brief(shape[i]));
    entry.shape.push_back(static_cast<int64_t>(dim));
    const uint64_t d = std::max<uint64_t>(dim, 1);
    if (span > limit / d) overflow = true;
    span *= d;
    numel *= dim;
  }
  const uint64_t itemsize = c10::elementSize(entry.dtype);
  overflow = overflow || span > limit / itemsize;
  DSCHAT_CHECK(!overflow, FormatError, at, ": shape ", brief(shape),
               " has more elements than 64-bit byte counts can address");
  const uint64_t nbytes = numel * itemsize;

  const auto& offsets = value["data_offsets"];
  DSCHAT_CHECK(offsets.is_array() && offsets.size() == 2 && as_index(offsets[0], &entry.begin) &&
                   as_index(offsets[1], &entry.end),
               FormatError, at, ": 'data_offsets' must be [begin, end] with integers in [0, 2^63), got ",
               brief(offsets));
  DSCHAT_CHECK(entry.begin <= entry.end, FormatError, at, ": data_offsets [", entry.begin, ", ",
               entry.end, ") end before they begin");
  DSCHAT_CHECK(entry.end <= data_size, FormatError, at, ": data_offsets [", entry.begin, ", ",
               entry.end, ") exceed the ", data_size, "-byte data section");
  DSCHAT_CHECK(entry.end - entry.begin == nbytes, FormatError, at, ": data_offsets [", entry.begin,
               ", ", entry.end, ") hold ", entry.end - entry.begin, " bytes but dtype ",
               known->name, " and shape ", brief(shape), " need ", nbytes);
  return entry;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const std::string& where, const uint8_t* bytes,
                                           size_t file_size) {
  DSCHAT_CHECK(file_size >= 8, FormatError, where, ": file has ", file_size,
               " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian on any host
  DSCHAT_CHECK(n <= file_size - 8, FormatError, where, ": header length ", n,
               " exceeds the ", file_size - 8, " bytes after the length field");
  DSCHAT_CHECK(n <= kMaxSafetensorsHeaderBytes, FormatError, where, ": header length ", n,
               " exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes");

  SafetensorsHeader header;
  header.data_start = 8 + n;
  header.data_size = file_size - header.data_start;
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  // nlohmann stops at a NUL byte as if the input ended: bytes after one would go unchecked.
  const void* nul = std::memchr(text, '\0', n);
  DSCHAT_CHECK(nul == nullptr, FormatError, where, ": header has a NUL byte at offset ",
               8 + (static_cast<const char*>(nul) - text), "; expected JSON text");
  nlohmann::json json = parse_json(where, text, text + n);
  DSCHAT_CHECK(json.is_object(), FormatError, where, ": header must be a JSON object, got ",
               brief(json));

  for (auto it = json.begin(); it != json.end(); ++it) {
    if (it.key() == "__metadata__") {
      header.metadata = parse_metadata(where, it.value());
    } else {
      header.entries.push_back(parse_entry(where, it.key(), it.value(), header.data_size));
    }
  }

  // Disjoint byte ranges: two tensors aliasing the same bytes would make writes through one
  // visible in the other. Empty ranges cannot overlap anything.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : header.entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& prev = *by_offset[i - 1];
    const auto& cur = *by_offset[i];
    DSCHAT_CHECK(prev.end <= cur.begin, FormatError, where, ": tensor '", cur.name,
                 "' data_offsets [", cur.begin, ", ", cur.end, ") overlap tensor '", prev.name,
                 "' data_offsets [", prev.begin, ", ", prev.end, ")");
  }
  return header;
}

std::string safetensors_dtype_name(torch::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "";
}

std::string safetensors_supported_dtypes() {
  std::string names;
  for (const auto& d : kDtypes) names += (names.empty() ? "" : ", ") + std::string(d.name);
  return names;
}

std::string build_safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                     const Metadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();  // throws on invalid UTF-8; the caller reports it
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace io
}  // namespace dschat
