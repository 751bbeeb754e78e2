# The Debian package: `cmake --build build --target package` makes build/tessera_<version>_<arch>.deb
# holding /usr/bin/tessera alone, stripped: the SPIR-V kernels and the ViT presets are compiled
# into the binary, which reads no other file of its own at run time. Its Depends line is derived
# from the binary by dpkg-shlibdeps, so it names exactly the Debian packages of the libraries
# tessera links, at the versions their symbols need; to those it adds a Vulkan driver.
# tools/check-package.sh installs it into a fresh Debian 12 and runs the demo there (README,
# "Install from a Debian package").
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
# The binary links the Vulkan loader, not a driver. Any Debian driver package provides vulkan-icd
# (nvidia-vulkan-icd too); where none is installed apt takes the first, lavapipe, so that tessera
# runs on the CPU at least. A Depends rather than a Recommends: images often install no Recommends.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "mesa-vulkan-drivers | vulkan-icd")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "openmpi-bin")  # mpirun, for training over several processes

# The version is `git describe` of the source tree when the package is made, in Debian's form
# (cmake/package_version.cmake, which cpack reads; these CPACK_TESSERA_ values reach it).
find_package(Git QUIET)
find_program(TESSERA_DPKG_SHLIBDEPS dpkg-shlibdeps)
set(CPACK_TESSERA_GIT "${GIT_EXECUTABLE}")
set(CPACK_TESSERA_SOURCE_DIR "${PROJECT_SOURCE_DIR}")
set(CPACK_TESSERA_PROJECT_VERSION "${PROJECT_VERSION}")
set(CPACK_TESSERA_DPKG_SHLIBDEPS "${TESSERA_DPKG_SHLIBDEPS}")
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/package_version.cmake)

include(CPack)
