// docs/models.md's "Supported models" table is the registry's (models::supported_families), and
// the registry names exactly the model_type values config.json parsing accepts.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "dschat/core/model_config.h"
#include "dschat/models/families.h"
#include "test_util.h"

namespace dschat {
namespace {

TEST(FamilyTable, DocsTableIsTheRegistry) {
  std::ifstream in(testing::source_dir() / "docs/models.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  const std::string begin = "<!-- families:begin -->\n", end = "<!-- families:end -->";
  const auto from = doc.find(begin), to = doc.find(end);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(doc.substr(from + begin.size(), to - from - begin.size()), models::supported_families_markdown())
      << "regenerate the table: dschat info --models";
}

TEST(FamilyTable, RegistryNamesEveryParsedModelType) {
  std::set<std::string> registry;
  for (const auto& family : models::supported_families()) {
    std::stringstream types(family.model_types);
    std::string type;
    while (std::getline(types, type, ',')) registry.insert(type.substr(type.find_first_not_of(' ')));
  }
  std::set<std::string> parsed;
  std::stringstream types(core::supported_model_types());
  std::string type;
  while (std::getline(types, type, ',')) parsed.insert(type.substr(type.find_first_not_of(' ')));
  EXPECT_EQ(registry, parsed);
}

}  // namespace
}  // namespace dschat
