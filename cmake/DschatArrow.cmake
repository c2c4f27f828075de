# Finds Apache Arrow's C++ libraries inside the PyPI pyarrow wheel (tools/setup.sh pins it into
# .venv): Debian 12 packages no Arrow, and the wheel ships libarrow/libparquet plus their headers.
#   in : DSCHAT_WITH_PARQUET (AUTO|ON|OFF), DSCHAT_PYTHON (set by DschatTorch.cmake)
#   out: DSCHAT_PARQUET_ENABLED, DSCHAT_ARROW_LIB_DIR, imported targets dschat_arrow::arrow and
#        dschat_arrow::parquet
# The wheel holds only the versioned files (libarrow.so.2600, no libarrow.so symlink), so the
# targets point at them by full path; the venv is never modified. The libraries find each other
# through their own RUNPATH ($ORIGIN); libdschat finds them through DSCHAT_ARROW_LIB_DIR in its
# BUILD_RPATH/INSTALL_RPATH, as it finds LibTorch.
set(DSCHAT_WITH_PARQUET "AUTO" CACHE STRING "Read Parquet data files: AUTO (on when the Python of DSCHAT_PYTHON has pyarrow with its C++ headers and libraries), ON, OFF")
set_property(CACHE DSCHAT_WITH_PARQUET PROPERTY STRINGS AUTO ON OFF)

set(DSCHAT_PARQUET_ENABLED OFF)
set(DSCHAT_ARROW_LIB_DIR "")
if(DSCHAT_WITH_PARQUET STREQUAL "AUTO" OR DSCHAT_WITH_PARQUET)
  execute_process(COMMAND "${DSCHAT_PYTHON}" -c
                    "import pyarrow, sys; sys.stdout.write(';'.join([pyarrow.get_include(), pyarrow.get_library_dirs()[0], pyarrow.cpp_build_info.so_version, pyarrow.__version__]))"
                  OUTPUT_VARIABLE _arrow_probe RESULT_VARIABLE _arrow_rc ERROR_VARIABLE _arrow_err)
  set(_arrow_problem "")
  if(NOT _arrow_rc EQUAL 0)
    set(_arrow_problem "cannot import pyarrow with ${DSCHAT_PYTHON} (run tools/setup.sh): ${_arrow_err}")
  else()
    list(GET _arrow_probe 0 _arrow_include)
    list(GET _arrow_probe 1 _arrow_dir)
    list(GET _arrow_probe 2 _arrow_so)
    list(GET _arrow_probe 3 _arrow_version)
    foreach(_file "${_arrow_include}/parquet/arrow/reader.h" "${_arrow_dir}/libarrow.so.${_arrow_so}"
                  "${_arrow_dir}/libparquet.so.${_arrow_so}")
      if(NOT EXISTS "${_file}")
        set(_arrow_problem "pyarrow ${_arrow_version} lacks ${_file}")
      endif()
    endforeach()
  endif()

  if(_arrow_problem STREQUAL "")
    set(DSCHAT_PARQUET_ENABLED ON)
    set(DSCHAT_ARROW_LIB_DIR "${_arrow_dir}")
    add_library(dschat_arrow::arrow SHARED IMPORTED)
    set_target_properties(dschat_arrow::arrow PROPERTIES
      IMPORTED_LOCATION "${_arrow_dir}/libarrow.so.${_arrow_so}" IMPORTED_SONAME "libarrow.so.${_arrow_so}"
      INTERFACE_INCLUDE_DIRECTORIES "${_arrow_include}")
    add_library(dschat_arrow::parquet SHARED IMPORTED)
    set_target_properties(dschat_arrow::parquet PROPERTIES
      IMPORTED_LOCATION "${_arrow_dir}/libparquet.so.${_arrow_so}" IMPORTED_SONAME "libparquet.so.${_arrow_so}"
      INTERFACE_LINK_LIBRARIES dschat_arrow::arrow)
    message(STATUS "dschat: Parquet via Arrow ${_arrow_version} from ${_arrow_dir}")
  elseif(DSCHAT_WITH_PARQUET STREQUAL "AUTO")
    message(STATUS "dschat: Parquet reading off: ${_arrow_problem}")
  else()
    message(FATAL_ERROR "dschat: DSCHAT_WITH_PARQUET=ON but ${_arrow_problem}")
  endif()
else()
  message(STATUS "dschat: Parquet reading off (DSCHAT_WITH_PARQUET=OFF)")
endif()
