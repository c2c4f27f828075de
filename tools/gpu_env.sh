# Sourced by tools/gpu_check.sh on the GPU machine (and by tools/gpu_deps_check.sh here), with
# $root set to the repository root: unpacks the Debian packages that tools/gpu_deps.sh put into
# build-gpu-deps/ into a private prefix (no root or registry needed) and points CMake, pkg-config,
# the loader and PATH at it. CPATH names only the multiarch folder (OpenSSL's opensslconf.h, which
# Debian's compiler finds by default in /usr/include/x86_64-linux-gnu): a global path to the
# prefix's include/ would put its fmt 9 ahead of LibTorch's bundled fmt, so CMake's imported
# targets add that one where it is needed, after LibTorch's.
# DSCHAT_GPU_DEPS_PREFIX: where to unpack. The default is beside the carried folder, not in it: an
# unpack left there by a dry run here (~110 MB) would push the carry over the tool's 64 MiB.
gpu_deps_prefix="${DSCHAT_GPU_DEPS_PREFIX:-$root/build-gpu-deps-root}"
# .unpacked holds the path it was unpacked at: the .pc files name it, so a moved copy is redone.
if [ -d "$root/build-gpu-deps" ] && [ "$(cat "$gpu_deps_prefix/.unpacked" 2>/dev/null)" != "$gpu_deps_prefix" ]; then
  rm -rf "$gpu_deps_prefix"
  for deb in "$root"/build-gpu-deps/*.deb; do dpkg-deb -x "$deb" "$gpu_deps_prefix"; done
  # Debian 12 puts some libraries (zlib) under /lib, which a merged-/usr system makes the same
  # folder as /usr/lib; merged here too, so that links such as libz.so -> libz.so.1.2.13 resolve.
  if [ -d "$gpu_deps_prefix/lib" ]; then
    cp -a "$gpu_deps_prefix/lib/." "$gpu_deps_prefix/usr/lib/" && rm -rf "$gpu_deps_prefix/lib"
  fi
  # Absolute links (zlib1g-dev's libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would reach the
  # machine's own files, if any: re-pointed into the prefix.
  find "$gpu_deps_prefix" -type l -lname '/*' | while read -r link; do
    target="$(readlink "$link")"
    ln -sfnr "$gpu_deps_prefix/usr${target#/usr}" "$link"
  done
  # pkg-config files name /usr in their variables (prefix=/usr, icu-uc.pc's "prefix = /usr",
  # exec_prefix=/usr, gtest.pc's libdir=/usr/lib/...): the private prefix instead.
  find "$gpu_deps_prefix" -name '*.pc' -exec sed -i -E "s#^([A-Za-z_]+ *= *)/usr(/| *\$)#\1$gpu_deps_prefix/usr\2#" {} +
  echo "$gpu_deps_prefix" > "$gpu_deps_prefix/.unpacked"
fi
if [ -d "$gpu_deps_prefix" ]; then
  gpu_deps_libdir="$gpu_deps_prefix/usr/lib/x86_64-linux-gnu"
  export CMAKE_PREFIX_PATH="$gpu_deps_prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$gpu_deps_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$gpu_deps_prefix/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
  export PKG_CONFIG_PATH="$gpu_deps_libdir/pkgconfig:$gpu_deps_prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  command -v pkg-config > /dev/null || export PATH="$PATH:$gpu_deps_prefix/usr/bin"
fi
