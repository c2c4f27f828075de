#pragma once
// The rows of a Parquet file as JSON objects, the shape every other data reader produces. Arrow's
// C++ Parquet reader (from the pyarrow wheel) does the decoding; no Arrow type appears here, so
// this header stays C++17 while parquet_rows.cpp is compiled as C++20 (Arrow 26 needs it).

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace dschat {
namespace data {

/// Every row of a Parquet file as a JSON object: column name -> value, as pyarrow's
/// `table.to_pylist()` gives it. Strings (and binary that is valid UTF-8) -> JSON strings; ints,
/// floats, bools; null -> null; list/large_list/fixed_size_list -> arrays; struct -> objects;
/// map -> array of {"key", "value"}; dictionary-encoded columns decoded.
/// Throws core::IoError (cannot open/read, naming the file), core::FormatError (not a Parquet
/// file, naming the file, with Arrow's message), core::Unsupported (a column type it cannot
/// convert, naming the column and type; or dschat built without Parquet).
std::vector<nlohmann::json> read_parquet_rows(const std::filesystem::path& file);

/// Only the named columns (others are not decoded). A column that does not exist throws
/// core::FormatError naming the file, the column and the columns that exist.
std::vector<nlohmann::json> read_parquet_rows(const std::filesystem::path& file,
                                              const std::vector<std::string>& columns);

}  // namespace data
}  // namespace dschat
