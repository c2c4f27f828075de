// Every validation of load_safetensors: the exception type and a message naming the file and,
// where it applies, the tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/io_cases.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

using core::FormatError;
using core::IoError;

class SafetensorsErrors : public ::testing::Test {
 protected:
  // Writes header + data to bad.safetensors and returns the path.
  std::filesystem::path write(const std::string& header, const std::string& data = std::string(16, '\0'),
                              int64_t length_override = -1) {
    auto file = dir_ / "bad.safetensors";
    testing::write_bytes(file, testing::safetensors_bytes(header, data, length_override));
    return file;
  }
  // A header with one F32 [2, 2] tensor "w" whose entry fields are replaced by `fields`.
  std::filesystem::path write_entry(const std::string& fields) {
    return write(R"({"w":{)" + fields + "}}");
  }
  testing::TempDir dir_;
};

TEST_F(SafetensorsErrors, MissingFileIsIoError) {
  EXPECT_THROW_WITH(load_safetensors(dir_ / "nope.safetensors"), IoError,
                    "nope.safetensors: cannot open for reading");
  EXPECT_THROW_WITH(load_safetensors(dir_.path()), IoError, "not a regular file");
}

TEST_F(SafetensorsErrors, FileShorterThanLengthField) {
  testing::write_bytes(dir_ / "short.safetensors", "abc");
  EXPECT_THROW_WITH(load_safetensors(dir_ / "short.safetensors"), FormatError,
                    "short.safetensors: file has 3 bytes, too short");
  testing::write_bytes(dir_ / "empty.safetensors", "");
  EXPECT_THROW_WITH(load_safetensors(dir_ / "empty.safetensors"), FormatError, "file has 0 bytes");
}

TEST_F(SafetensorsErrors, HeaderLengthBeyondFile) {
  auto file = write("{}", "", 1000);
  EXPECT_THROW_WITH(load_safetensors(file), FormatError,
                    "bad.safetensors: header length 1000 exceeds the 2 bytes after the length field");
  file = write("{}", "", int64_t{1} << 62);
  EXPECT_THROW_WITH(load_safetensors(file), FormatError, "header length 4611686018427387904 exceeds");
}

TEST_F(SafetensorsErrors, AbsurdHeaderLengthInsideAHugeSparseFile) {
  auto file = write("{}", "", 150'000'000);
  ASSERT_EQ(::truncate(file.c_str(), 200'000'000), 0);  // sparse: costs no disk
  EXPECT_THROW_WITH(load_safetensors(file), FormatError,
                    "header length 150000000 exceeds the limit of 100000000 bytes");
}

TEST_F(SafetensorsErrors, HeaderNotJsonOrNotAnObject) {
  EXPECT_THROW_WITH(load_safetensors(write("{\"w\": ")), FormatError,
                    "bad.safetensors: header is not valid JSON");
  EXPECT_THROW_WITH(load_safetensors(write("[1, 2]")), FormatError,
                    "bad.safetensors: header must be a JSON object, got [1,2]");
  EXPECT_THROW_WITH(load_safetensors(write(std::string("{}\0\0", 4), "")), FormatError,
                    "bad.safetensors: header has a NUL byte at offset 10");
  EXPECT_THROW_WITH(load_safetensors(write(R"({"w":1,"w":2})")), FormatError,
                    "header has the key 'w' more than once");
}

TEST_F(SafetensorsErrors, DeeplyNestedHeaderIsRejectedWithoutRecursion) {
  const size_t depth = 200000;
  auto file = write(R"({"w":)" + std::string(depth, '[') + std::string(depth, ']') + "}");
  EXPECT_THROW_WITH(load_safetensors(file), FormatError,
                    "bad.safetensors: tensor 'w': entry must be an object, got an array of 1 elements");
}

TEST_F(SafetensorsErrors, EntryNotAnObjectOrMissingKeys) {
  EXPECT_THROW_WITH(load_safetensors(write(R"({"w":[1]})")), FormatError,
                    "bad.safetensors: tensor 'w': entry must be an object");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("shape":[2,2],"data_offsets":[0,16])")),
                    FormatError, "bad.safetensors: tensor 'w': entry has no 'dtype'");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","data_offsets":[0,16])")),
                    FormatError, "tensor 'w': entry has no 'shape'");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2])")), FormatError,
                    "tensor 'w': entry has no 'data_offsets'");
}

TEST_F(SafetensorsErrors, WrongFieldTypes) {
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":4,"shape":[2,2],"data_offsets":[0,16])")),
                    FormatError, "tensor 'w': 'dtype' must be a string, got 4");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":"2x2","data_offsets":[0,16])")),
                    FormatError, "tensor 'w': 'shape' must be an array, got \"2x2\"");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2.5],"data_offsets":[0,16])")),
                    FormatError, "tensor 'w': shape[1] must be an integer in [0, 2^63), got 2.5");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2],"data_offsets":[0])")),
                    FormatError, "tensor 'w': 'data_offsets' must be [begin, end]");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2],"data_offsets":[0,"16"])")),
                    FormatError, "'data_offsets' must be [begin, end] with integers in [0, 2^63), got");
  EXPECT_THROW_WITH(load_safetensors(write(R"({"__metadata__":{"k":1}})")), FormatError,
                    "bad.safetensors: '__metadata__' key 'k' must be a string, got 1");
  EXPECT_THROW_WITH(load_safetensors(write(R"({"__metadata__":[]})")), FormatError,
                    "'__metadata__' must be an object of strings");
}

TEST_F(SafetensorsErrors, UnknownDtypeListsSupportedOnes) {
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F33","shape":[2,2],"data_offsets":[0,16])")),
                    FormatError,
                    "bad.safetensors: tensor 'w': unknown dtype \"F33\" (supported: F64, F32, F16, BF16");
}

TEST_F(SafetensorsErrors, NegativeAndOverflowingShapes) {
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,-2],"data_offsets":[0,16])")),
                    FormatError, "tensor 'w': shape[1] must be an integer in [0, 2^63), got -2");
  EXPECT_THROW_WITH(
      load_safetensors(write_entry(R"("dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16])")),
      FormatError, "tensor 'w': shape [4611686018427387904,4] has more elements than 64-bit");
  // numel fits in int64 but numel * 4 bytes does not.
  EXPECT_THROW_WITH(
      load_safetensors(write_entry(R"("dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,16])")),
      FormatError, "has more elements than 64-bit");
  EXPECT_THROW_WITH(
      load_safetensors(write_entry(R"("dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,16])")),
      FormatError, "shape[0] must be an integer in [0, 2^63)");
  // Empty, but the contiguous strides (products of max(dim, 1)) would overflow.
  EXPECT_THROW_WITH(
      load_safetensors(write_entry(R"("dtype":"U8","shape":[4611686018427387904,4,0],"data_offsets":[0,0])")),
      FormatError, "has more elements than 64-bit");
  EXPECT_THROW_WITH(
      load_safetensors(write_entry(R"("dtype":"U8","shape":[0,4611686018427387904,4],"data_offsets":[0,0])")),
      FormatError, "has more elements than 64-bit");
  // Empty with large but addressable dims is fine.
  TensorMap ok = load_safetensors(write_entry(R"("dtype":"F32","shape":[0,1048576],"data_offsets":[0,0])"));
  EXPECT_EQ(ok.at("w").sizes(), c10::IntArrayRef({0, 1048576}));
}

TEST_F(SafetensorsErrors, OffsetsOutOfOrderOutOfRangeOrWrongSize) {
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2],"data_offsets":[16,0])")),
                    FormatError, "bad.safetensors: tensor 'w': data_offsets [16, 0) end before they begin");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2],"data_offsets":[8,24])")),
                    FormatError, "tensor 'w': data_offsets [8, 24) exceed the 16-byte data section");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,2],"data_offsets":[-1,15])")),
                    FormatError, "tensor 'w': 'data_offsets' must be [begin, end]");
  EXPECT_THROW_WITH(load_safetensors(write_entry(R"("dtype":"F32","shape":[2,3],"data_offsets":[0,16])")),
                    FormatError,
                    "tensor 'w': data_offsets [0, 16) hold 16 bytes but dtype F32 and shape [2,3] need 24");
}

TEST_F(SafetensorsErrors, OverlappingTensorsNameBoth) {
  auto file = write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})");
  EXPECT_THROW_WITH(load_safetensors(file), FormatError,
                    "bad.safetensors: tensor 'b' data_offsets [4, 12) overlap tensor 'a' data_offsets [0, 8)");
  // Identical ranges overlap too; empty tensors overlap nothing.
  file = write(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]}})");
  EXPECT_THROW_WITH(load_safetensors(file), FormatError, "tensor 'b' data_offsets [0, 4) overlap tensor 'a'");
}

TEST_F(SafetensorsErrors, BoolBytesMustBeZeroOrOne) {
  auto file = write(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x01\x00\x02", 3));
  EXPECT_THROW_WITH(load_safetensors(file), FormatError,
                    "bad.safetensors: tensor 'm': BOOL element 2 has byte value 2, expected 0 or 1");
}

TEST_F(SafetensorsErrors, GapsAndUnknownEntryKeysAreAccepted) {
  // Not produced by the reference writer, but harmless: a gap before "w" and an extra key.
  float v[2] = {1.0f, 2.0f};
  std::string data(4, '\0');
  data.append(reinterpret_cast<const char*>(v), sizeof(v));
  auto file = write(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12],"extra":1}})", data);
  TensorMap loaded = load_safetensors(file);
  EXPECT_TRUE(torch::equal(loaded.at("w"), torch::tensor({1.0f, 2.0f})));
}

}  // namespace
}  // namespace io
}  // namespace dschat
