#include "serve/server_state.h"

namespace dschat {
namespace serve {

const std::string& web_page() {
  static const std::string page =
#include "dschat_web_page.inc"
      ;
  return page;
}

}  // namespace serve
}  // namespace dschat
