// Parquet rows against pyarrow: tests/fixtures/parquet/<name>.expected.json is pyarrow's
// `table.to_pylist()` of <name>.parquet, written by tools/make_parquet_fixtures.py from the same
// wheel whose libparquet dschat links. Also column selection and the errors that name the file.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/parquet_rows.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

std::filesystem::path parquet_fixture(const std::string& name) { return testing::fixture("parquet/" + name); }

std::vector<json> expected_rows(const std::string& name) {
  std::ifstream in(parquet_fixture(name + ".expected.json"));
  EXPECT_TRUE(in.good()) << "missing " << name << ".expected.json; run tools/make_parquet_fixtures.py";
  return json::parse(in).get<std::vector<json>>();
}

// Row by row and column by column, so that a mismatch names the cell instead of dumping the file.
void expect_same_rows(const std::vector<json>& got, const std::vector<json>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_TRUE(got[r].is_object()) << "row " << r << ": " << got[r].dump();
    EXPECT_EQ(got[r].size(), want[r].size()) << "row " << r << ": " << got[r].dump();
    for (const auto& [column, value] : want[r].items()) {
      ASSERT_TRUE(got[r].contains(column)) << "row " << r << " lacks '" << column << "'";
      // nlohmann compares numbers by value across int/unsigned/float, as Python does.
      EXPECT_EQ(got[r][column], value) << "row " << r << ", column '" << column << "'";
    }
  }
}

bool parquet_built() {
  try {
    data::read_parquet_rows(parquet_fixture("row_groups.parquet"), {"id"});
    return true;
  } catch (const core::Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("DSCHAT_WITH_PARQUET=ON"), std::string::npos) << e.what();
    return false;
  }
}

#define SKIP_WITHOUT_PARQUET() \
  if (!parquet_built()) GTEST_SKIP() << "dschat built without Parquet (DSCHAT_WITH_PARQUET=OFF)"

TEST(ParquetRows, EveryTypeMatchesPyarrow) {
  SKIP_WITHOUT_PARQUET();
  auto rows = data::read_parquet_rows(parquet_fixture("all_types.parquet"));
  expect_same_rows(rows, expected_rows("all_types"));
  // Spot checks that do not depend on the expected file, in case both sides went wrong together.
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["quotes_0"]["title"], json::array({"Rayleigh scattering"}));
  EXPECT_EQ(rows[0]["turns"][1]["content"], "Hello 👋");
  EXPECT_EQ(rows[1]["text"], "Grüße, 世界 😀🎉");
  EXPECT_EQ(rows[3]["category"], "chosen");
  EXPECT_EQ(rows[0]["u64"].get<uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(rows[1]["id"].get<int64_t>(), INT64_MIN);
  EXPECT_TRUE(rows[2]["question"].is_null());
  EXPECT_TRUE(rows[1]["nested"]["meta"].is_null());
  EXPECT_EQ(rows[0]["attrs"], json::parse(R"([{"key": "k", "value": 1}, {"key": "l", "value": 2}])"));
  EXPECT_EQ(rows[2]["large_text"], std::string("\0nul inside", 11));
}

TEST(ParquetRows, SeveralRowGroupsAndPerGroupDictionaries) {
  SKIP_WITHOUT_PARQUET();
  auto rows = data::read_parquet_rows(parquet_fixture("row_groups.parquet"));
  expect_same_rows(rows, expected_rows("row_groups"));
  ASSERT_EQ(rows.size(), 130u);
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_EQ(rows[r]["id"], r);  // file order across the row groups of 40, 40, 40 and 10 rows
    EXPECT_EQ(rows[r]["kind"], r % 2 ? "odd" : "even");
  }
}

TEST(ParquetRows, SelectedColumnsOnly) {
  SKIP_WITHOUT_PARQUET();
  auto all = expected_rows("all_types");
  auto rows = data::read_parquet_rows(parquet_fixture("all_types.parquet"), {"turns", "id", "question"});
  ASSERT_EQ(rows.size(), all.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(rows[r], (json{{"id", all[r]["id"]}, {"turns", all[r]["turns"]}, {"question", all[r]["question"]}}))
        << "row " << r;
  }
  // No columns: one empty object per row.
  auto empty = data::read_parquet_rows(parquet_fixture("row_groups.parquet"), {});
  ASSERT_EQ(empty.size(), 130u);
  EXPECT_EQ(empty[7], json::object());
}

TEST(ParquetRows, UnselectedUnsupportedColumnsAreNotDecoded) {
  SKIP_WITHOUT_PARQUET();
  auto file = parquet_fixture("unsupported.parquet");
  EXPECT_EQ(data::read_parquet_rows(file, {"id"}), (std::vector<json>{{{"id", 1}}, {{"id", 2}}}));
  EXPECT_THROW_WITH(data::read_parquet_rows(file), core::Unsupported, "column 'when' has type timestamp[ms]");
  EXPECT_THROW_WITH(data::read_parquet_rows(file, {"price"}), core::Unsupported,
                    "unsupported.parquet: column 'price' has type decimal");
}

TEST(ParquetRows, BinaryThatIsNotTextIsNamed) {
  SKIP_WITHOUT_PARQUET();
  auto file = parquet_fixture("not_utf8.parquet");
  EXPECT_EQ(data::read_parquet_rows(file, {"ok"}).at(1), (json{{"ok", "b"}}));
  EXPECT_THROW_WITH(data::read_parquet_rows(file), core::Unsupported,
                    "not_utf8.parquet: column 'raw' (binary) holds bytes that are not UTF-8");
}

TEST(ParquetRows, MissingColumnListsTheColumns) {
  SKIP_WITHOUT_PARQUET();
  EXPECT_THROW_WITH(data::read_parquet_rows(parquet_fixture("row_groups.parquet"), {"id", "chosen"}),
                    core::FormatError,
                    "row_groups.parquet: no column 'chosen'; the file has columns 'id', 'prompt', 'ids', 'kind'");
}

TEST(ParquetRows, MissingFileIsAnIoError) {
  SKIP_WITHOUT_PARQUET();
  testing::TempDir tmp;
  EXPECT_THROW_WITH(data::read_parquet_rows(tmp / "absent.parquet"), core::IoError,
                    "absent.parquet: cannot open Parquet file: no such file");
  EXPECT_THROW_WITH(data::read_parquet_rows(tmp.path()), core::IoError, "it is a directory");
}

TEST(ParquetRows, NonParquetAndTruncatedFilesAreFormatErrors) {
  SKIP_WITHOUT_PARQUET();
  EXPECT_THROW_WITH(data::read_parquet_rows(parquet_fixture("not_parquet.parquet")), core::FormatError,
                    "not_parquet.parquet: not a Parquet file (or a corrupt one): ");
  // A real Parquet file cut in half: the magic at the front is right, the footer is gone.
  testing::TempDir tmp;
  std::ifstream in(parquet_fixture("row_groups.parquet"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(tmp / "cut.parquet", std::ios::binary).write(bytes.data(), bytes.size() / 2);
  EXPECT_THROW_WITH(data::read_parquet_rows(tmp / "cut.parquet"), core::FormatError, "cut.parquet: ");
  std::ofstream(tmp / "empty.parquet", std::ios::binary).close();
  EXPECT_THROW_WITH(data::read_parquet_rows(tmp / "empty.parquet"), core::FormatError,
                    "empty.parquet: not a Parquet file");
}

// The wheel's libparquet exports the symbols of the OpenSSL it bundles; the first library in the
// global lookup order wins every EVP_* reference, so the system libcrypto must precede it (see
// the link order in CMakeLists.txt). Mixed copies would hand one copy's objects to the other.
// (LD_PRELOAD=.../pyarrow/libparquet.so.2600 makes this test fail.)
TEST(ParquetRows, SystemOpenSslIsNotShadowedByArrowsCopy) {
  void* crypto = dlopen("libcrypto.so.3", RTLD_LAZY | RTLD_NOLOAD);
  if (!crypto) GTEST_SKIP() << "libcrypto.so.3 is not loaded in this process";
  for (const char* name : {"EVP_MD_CTX_new", "EVP_sha256", "EVP_DigestFinal_ex"}) {
    void* winner = dlsym(RTLD_DEFAULT, name);
    Dl_info info{};
    ASSERT_NE(dladdr(winner, &info), 0) << name;
    EXPECT_EQ(winner, dlsym(crypto, name)) << name << " resolves into " << info.dli_fname;
  }
  dlclose(crypto);
}

}  // namespace
}  // namespace dschat
