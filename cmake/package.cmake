# The Debian package: `cmake --build build --target package` makes build/tessera_<version>_<arch>.deb
# holding /usr/bin/tessera alone (the shaders are compiled into it), stripped. Its Depends line is
# derived from the binary by dpkg-shlibdeps, so it names exactly the Debian packages of the
# libraries tessera links, at the versions their symbols need. tools/check-package.sh installs it
# into a fresh Debian 12 and runs the demo there (README, "Install from a Debian package").
include(GNUInstallDirs)
install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME tessera)
set(CPACK_PACKAGE_VENDOR tessera)
set(CPACK_PACKAGE_CONTACT "tessera maintainers <tessera@localhost>")  # placeholder: no public address yet
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "CNN training and feature extraction for gigapixel histopathology on Vulkan")
set(CPACK_PACKAGE_DESCRIPTION "\
Tessera tiles whole-slide images (OpenSlide formats, TIFF, DICOM, OME-TIFF) into LMDB tile stores,
trains CNNs on them, extracts features with CNNs and patch encoders (UNI, Virchow2, ...) and trains
slide-level heads, with every pass a GLSL compute shader on any Vulkan device: NVIDIA, AMD, Intel,
or the CPU through Mesa's lavapipe.")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # tessera_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Tessera needs a Vulkan driver, which the binary does not link: lavapipe (the CPU) unless the
# machine has another. A Recommends, so that `apt install` brings it by default and a GPU node can
# leave it out (--no-install-recommends) where its vendor's driver is not a Debian package.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "mesa-vulkan-drivers | vulkan-icd")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "openmpi-bin")  # mpirun, for training over several processes

# The version is asked of the binary when the package is made (`tessera --version`), so that the
# two never disagree: whatever sets --version (the project's version, or a tag and commit) sets the
# package's. The file is generated to know where the binary is.
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_BINARY_DIR}/CPackProjectConfig.cmake)
file(GENERATE OUTPUT ${CPACK_PROJECT_CONFIG_FILE} INPUT ${CMAKE_CURRENT_LIST_DIR}/package_version.cmake.in)
set(CPACK_TESSERA_FALLBACK_VERSION ${PROJECT_VERSION})

include(CPack)
