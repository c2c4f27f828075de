# DSCHAT_SANITIZE="address;undefined": instrument every target of this project (not LibTorch).
if(DSCHAT_SANITIZE)
  string(REPLACE ";" "," _san "${DSCHAT_SANITIZE}")
  add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${_san})
  message(STATUS "dschat: sanitizers ${_san}")
endif()
