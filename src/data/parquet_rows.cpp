// Parquet -> JSON rows through Arrow's C++ Parquet reader (the libarrow/libparquet of the pyarrow
// wheel, see cmake/DschatArrow.cmake). Each top-level column is read whole (all row groups, one
// Arrow chunk per group or so) and converted array by array: a typed loop per column instead of
// one Arrow scalar per cell. Nested arrays convert their child arrays once and then hand out the
// converted values by offset. This file is the only one that sees Arrow headers; it is compiled
// as C++20 because Arrow 26's headers use std::span and <bit>.
#include "data/parquet_rows.h"

#include "dschat/core/error.h"

#ifdef DSCHAT_WITH_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>

#include <algorithm>
#include <new>
#include <string_view>
#endif

namespace dschat {
namespace data {

#ifdef DSCHAT_WITH_PARQUET
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF), the rule Python's bytes.decode
// applies, so that binary cells become text exactly when pyarrow users could decode them.
bool is_valid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    unsigned char lead = *p;
    if (lead < 0x80) {
      ++p;
      continue;
    }
    int extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC2 ? 1 : -1;
    if (extra < 0 || lead > 0xF4 || end - p <= extra) return false;
    // The second byte carries the overlong/surrogate/range limits of each lead byte.
    unsigned char low = 0x80, high = 0xBF;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
    if (p[1] < low || p[1] > high) return false;
    for (int k = 2; k <= extra; ++k) {
      if ((p[k] & 0xC0) != 0x80) return false;
    }
    p += extra + 1;
  }
  return true;
}

class ColumnConverter {
 public:
  explicit ColumnConverter(const fs::path& file) : file_(file) {}

  /// One JSON value per element of `array`; `column` names it in errors ("quotes_0.title[]").
  std::vector<json> convert(const arrow::Array& array, const std::string& column) const {
    using T = arrow::Type;
    switch (array.type_id()) {
      case T::NA: return std::vector<json>(array.length(), nullptr);
      case T::BOOL: return primitive<arrow::BooleanArray>(array);
      case T::INT8: return primitive<arrow::Int8Array>(array);
      case T::INT16: return primitive<arrow::Int16Array>(array);
      case T::INT32: return primitive<arrow::Int32Array>(array);
      case T::INT64: return primitive<arrow::Int64Array>(array);
      case T::UINT8: return primitive<arrow::UInt8Array>(array);
      case T::UINT16: return primitive<arrow::UInt16Array>(array);
      case T::UINT32: return primitive<arrow::UInt32Array>(array);
      case T::UINT64: return primitive<arrow::UInt64Array>(array);
      case T::FLOAT: return primitive<arrow::FloatArray, double>(array);
      case T::DOUBLE: return primitive<arrow::DoubleArray>(array);
      case T::STRING: return strings<arrow::StringArray>(array, column, false);
      case T::LARGE_STRING: return strings<arrow::LargeStringArray>(array, column, false);
      case T::STRING_VIEW: return strings<arrow::StringViewArray>(array, column, false);
      case T::BINARY: return strings<arrow::BinaryArray>(array, column, true);
      case T::LARGE_BINARY: return strings<arrow::LargeBinaryArray>(array, column, true);
      case T::BINARY_VIEW: return strings<arrow::BinaryViewArray>(array, column, true);
      case T::FIXED_SIZE_BINARY: return strings<arrow::FixedSizeBinaryArray>(array, column, true);
      case T::LIST: return lists<arrow::ListArray>(array, column);
      case T::LARGE_LIST: return lists<arrow::LargeListArray>(array, column);
      case T::FIXED_SIZE_LIST: return lists<arrow::FixedSizeListArray>(array, column);
      case T::MAP: return maps(static_cast<const arrow::MapArray&>(array), column);
      case T::STRUCT: return structs(static_cast<const arrow::StructArray&>(array), column);
      case T::DICTIONARY: return dictionary(static_cast<const arrow::DictionaryArray&>(array), column);
      default:
        // Dates, timestamps, decimals, durations, unions...: pyarrow turns them into Python
        // objects that have no single JSON form, so dschat refuses rather than guess one.
        DSCHAT_THROW(Unsupported, file_.string(), ": column '", column, "' has type ", array.type()->ToString(),
                     ", which dschat cannot convert to JSON (supported: strings, binary UTF-8 text, "
                     "integers, floats, bools, nulls, lists, structs, maps, dictionaries)");
    }
  }

 private:
  template <typename ArrayType, typename Out = void>
  static std::vector<json> primitive(const arrow::Array& array) {
    const auto& typed = static_cast<const ArrayType&>(array);
    std::vector<json> out(typed.length());
    for (int64_t i = 0; i < typed.length(); ++i) {
      if (typed.IsNull(i)) continue;  // json() is null
      if constexpr (std::is_void_v<Out>) {
        out[i] = typed.Value(i);
      } else {
        out[i] = static_cast<Out>(typed.Value(i));  // float32 -> the float64 Python would show
      }
    }
    return out;
  }

  template <typename ArrayType>
  std::vector<json> strings(const arrow::Array& array, const std::string& column, bool check_utf8) const {
    const auto& typed = static_cast<const ArrayType&>(array);
    std::vector<json> out(typed.length());
    for (int64_t i = 0; i < typed.length(); ++i) {
      if (typed.IsNull(i)) continue;
      std::string_view view = typed.GetView(i);
      DSCHAT_CHECK(!check_utf8 || is_valid_utf8(view), Unsupported, file_.string(), ": column '", column,
                   "' (", array.type()->ToString(), ") holds bytes that are not UTF-8 text (element ", i,
                   " of its chunk); only binary that is text can be converted to JSON");
      out[i] = std::string(view);
    }
    return out;
  }

  // Only the part of the child that the (possibly sliced) list covers is converted.
  template <typename ArrayType>
  std::vector<json> lists(const arrow::Array& array, const std::string& column) const {
    const auto& typed = static_cast<const ArrayType&>(array);
    const int64_t n = typed.length();
    const int64_t begin = n ? typed.value_offset(0) : 0;
    const int64_t end = n ? typed.value_offset(n - 1) + typed.value_length(n - 1) : 0;
    std::vector<json> items = convert(*typed.values()->Slice(begin, end - begin), column + "[]");
    std::vector<json> out(n);
    for (int64_t i = 0; i < n; ++i) {
      if (typed.IsNull(i)) continue;
      json list = json::array();
      auto& target = list.get_ref<json::array_t&>();
      const int64_t first = typed.value_offset(i) - begin;
      target.reserve(typed.value_length(i));
      for (int64_t k = 0; k < typed.value_length(i); ++k) target.push_back(std::move(items[first + k]));
      out[i] = std::move(list);
    }
    return out;
  }

  // pyarrow gives a map as [(key, value), ...]; JSON has no tuples, so each entry is an object.
  std::vector<json> maps(const arrow::MapArray& typed, const std::string& column) const {
    const int64_t n = typed.length();
    const int64_t begin = n ? typed.value_offset(0) : 0;
    const int64_t end = n ? typed.value_offset(n) : 0;
    // Through the entry struct's field(): unlike MapArray::keys(), it honours the struct's offset.
    const auto& entry = static_cast<const arrow::StructArray&>(*typed.values());
    std::vector<json> keys = convert(*entry.field(0)->Slice(begin, end - begin), column + ".key");
    std::vector<json> values = convert(*entry.field(1)->Slice(begin, end - begin), column + ".value");
    std::vector<json> out(n);
    for (int64_t i = 0; i < n; ++i) {
      if (typed.IsNull(i)) continue;
      json entries = json::array();
      for (int64_t k = typed.value_offset(i) - begin; k < typed.value_offset(i + 1) - begin; ++k) {
        entries.push_back(json{{"key", std::move(keys[k])}, {"value", std::move(values[k])}});
      }
      out[i] = std::move(entries);
    }
    return out;
  }

  std::vector<json> structs(const arrow::StructArray& typed, const std::string& column) const {
    std::vector<json> out(typed.length());
    for (int64_t i = 0; i < typed.length(); ++i) {
      if (!typed.IsNull(i)) out[i] = json::object();
    }
    for (int f = 0; f < typed.num_fields(); ++f) {
      const std::string& name = typed.struct_type()->field(f)->name();
      std::vector<json> values = convert(*typed.field(f), column + "." + name);  // field() is sliced
      for (int64_t i = 0; i < typed.length(); ++i) {
        if (out[i].is_object()) out[i][name] = std::move(values[i]);
      }
    }
    return out;
  }

  // The dictionary is converted once per chunk; each row copies its entry.
  std::vector<json> dictionary(const arrow::DictionaryArray& typed, const std::string& column) const {
    std::vector<json> entries = convert(*typed.dictionary(), column);
    std::vector<json> out(typed.length());
    for (int64_t i = 0; i < typed.length(); ++i) {
      if (typed.IsNull(i)) continue;
      const int64_t index = typed.GetValueIndex(i);
      DSCHAT_CHECK(index >= 0 && index < static_cast<int64_t>(entries.size()), FormatError, file_.string(),
                   ": column '", column, "' has dictionary index ", index, " outside its ", entries.size(),
                   "-entry dictionary");
      out[i] = entries[index];
    }
    return out;
  }

  const fs::path& file_;
};

std::string joined_names(const arrow::Schema& schema) {
  std::string names;
  for (const auto& field : schema.fields()) names += (names.empty() ? "'" : ", '") + field->name() + "'";
  return names.empty() ? "none" : names;
}

std::unique_ptr<parquet::arrow::FileReader> open_reader(const fs::path& file) {
  std::error_code error;
  DSCHAT_CHECK(fs::exists(file, error), IoError, file.string(), ": cannot open Parquet file: no such file");
  DSCHAT_CHECK(!fs::is_directory(file, error), IoError, file.string(),
               ": cannot open Parquet file: it is a directory");
  // The system allocator, not Arrow's default jemalloc pool: a one-off read should not leave a
  // second caching allocator (and its arenas) behind in a process that also runs LibTorch.
  arrow::MemoryPool* pool = arrow::system_memory_pool();
  auto opened = arrow::io::ReadableFile::Open(file.string(), pool);
  DSCHAT_CHECK(opened.ok(), IoError, file.string(), ": cannot open Parquet file: ",
               opened.status().message());
  // Past this point the bytes are readable, so a failure is the content's fault.
  auto reader = parquet::arrow::OpenFile(*opened, pool);
  DSCHAT_CHECK(reader.ok(), FormatError, file.string(), ": not a Parquet file (or a corrupt one): ",
               reader.status().message());
  return std::move(*reader);
}

std::vector<json> read_selected_rows(const fs::path& file, const std::vector<std::string>* selected) {
  auto reader = open_reader(file);
  std::shared_ptr<arrow::Schema> schema;
  arrow::Status status = reader->GetSchema(&schema);
  DSCHAT_CHECK(status.ok(), FormatError, file.string(), ": cannot read the Parquet schema: ", status.message());

  std::vector<int> fields;  // top-level field indices, in output order
  if (selected) {
    for (const std::string& name : *selected) {
      std::vector<int> found = schema->GetAllFieldIndices(name);
      DSCHAT_CHECK(!found.empty(), FormatError, file.string(), ": no column '", name,
                   "'; the file has columns ", joined_names(*schema));
      DSCHAT_CHECK(found.size() == 1, FormatError, file.string(), ": ", found.size(), " columns are named '",
                   name, "'");
      if (std::find(fields.begin(), fields.end(), found[0]) == fields.end()) fields.push_back(found[0]);
    }
  } else {
    for (int f = 0; f < schema->num_fields(); ++f) {
      const std::string& name = schema->field(f)->name();
      DSCHAT_CHECK(schema->GetAllFieldIndices(name).size() == 1, FormatError, file.string(),
                   ": several columns are named '", name, "', so rows cannot be JSON objects");
      fields.push_back(f);
    }
  }

  const int64_t num_rows = reader->parquet_reader()->metadata()->num_rows();
  std::vector<json> rows(num_rows, json::object());
  ColumnConverter converter(file);
  for (int f : fields) {
    const std::string& name = schema->field(f)->name();
    std::shared_ptr<arrow::ChunkedArray> column;
    status = reader->ReadColumn(f, &column);
    DSCHAT_CHECK(status.ok(), FormatError, file.string(), ": cannot read column '", name, "': ", status.message());
    DSCHAT_CHECK(column->length() == num_rows, FormatError, file.string(), ": column '", name, "' has ",
                 column->length(), " values but the file says it has ", num_rows, " rows");
    int64_t row = 0;
    for (const auto& chunk : column->chunks()) {
      for (json& value : converter.convert(*chunk, name)) rows[row++][name] = std::move(value);
    }
  }
  return rows;
}

// Arrow and Parquet report errors as Status values, but a few paths throw (parquet::
// ParquetException and friends); those become FormatError naming the file too.
std::vector<json> read_rows_guarded(const fs::path& file, const std::vector<std::string>* selected) {
  try {
    return read_selected_rows(file, selected);
  } catch (const core::Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    DSCHAT_THROW(FormatError, file.string(), ": cannot read Parquet file: ", e.what());
  }
}

}  // namespace

std::vector<nlohmann::json> read_parquet_rows(const std::filesystem::path& file) {
  return read_rows_guarded(file, nullptr);
}

std::vector<nlohmann::json> read_parquet_rows(const std::filesystem::path& file,
                                              const std::vector<std::string>& columns) {
  return read_rows_guarded(file, &columns);
}

#else  // !DSCHAT_WITH_PARQUET

namespace {
[[noreturn]] void parquet_not_built(const std::filesystem::path& file) {
  DSCHAT_THROW(Unsupported, file.string(),
               ": this dschat was built without Parquet support; convert the file to JSON Lines (e.g. "
               "python -c \"import json,sys,pyarrow.parquet as pq; [print(json.dumps(r)) for r in "
               "pq.read_table(sys.argv[1]).to_pylist()]\" FILE.parquet > FILE.jsonl) or rebuild dschat "
               "with -DDSCHAT_WITH_PARQUET=ON (needs pyarrow in the build's Python, see tools/setup.sh)");
}
}  // namespace

std::vector<nlohmann::json> read_parquet_rows(const std::filesystem::path& file) { parquet_not_built(file); }

std::vector<nlohmann::json> read_parquet_rows(const std::filesystem::path& file, const std::vector<std::string>&) {
  parquet_not_built(file);
}

#endif  // DSCHAT_WITH_PARQUET

}  // namespace data
}  // namespace dschat
