# Read by cpack when it makes the package (CPACK_PROJECT_CONFIG_FILE, set by cmake/package.cmake).
# The package's version is `git describe --tags --dirty` of the source tree, in Debian's form (a
# hyphen would start a Debian revision, and a version starts with a digit):
#   v1.2.0                     1.2.0
#   v1.2.0-3-gabc1234-dirty    1.2.0+3.gabc1234.dirty     (sorts after 1.2.0)
#   no tag                     <project version>+<commits>.g<commit>[.dirty]   (0.1.0+334.g41e8505)
#   not a git checkout         <project version>
# so that each later commit's package is an upgrade of the one before.
if(NOT CPACK_TESSERA_DPKG_SHLIBDEPS)
  message(FATAL_ERROR "package: dpkg-shlibdeps is missing (apt-get install dpkg-dev); without it the package "
                      "would declare none of the libraries tessera links")
endif()

function(tessera_git output)
  execute_process(COMMAND "${CPACK_TESSERA_GIT}" ${ARGN} WORKING_DIRECTORY "${CPACK_TESSERA_SOURCE_DIR}"
                  OUTPUT_VARIABLE text RESULT_VARIABLE failed OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(failed)
    set(text "")
  endif()
  set(${output} "${text}" PARENT_SCOPE)
endfunction()

set(tessera_package_version "${CPACK_TESSERA_PROJECT_VERSION}")
set(tessera_toplevel "")
if(CPACK_TESSERA_GIT)
  tessera_git(tessera_toplevel rev-parse --show-toplevel)
endif()
# Only the source tree's own repository: not one it was unpacked inside.
if(tessera_toplevel)
  file(REAL_PATH "${tessera_toplevel}" tessera_toplevel)
  file(REAL_PATH "${CPACK_TESSERA_SOURCE_DIR}" tessera_source)
endif()
if(tessera_toplevel AND tessera_toplevel STREQUAL tessera_source)
  tessera_git(tessera_described describe --tags --dirty)
  if(tessera_described MATCHES "^v?([0-9][0-9A-Za-z.~]*)(-([0-9]+)-g([0-9a-f]+))?(-dirty)?$")
    set(tessera_package_version "${CMAKE_MATCH_1}")
    set(tessera_since_tag "${CMAKE_MATCH_3}")
    set(tessera_commit "${CMAKE_MATCH_4}")
    set(tessera_dirty "${CMAKE_MATCH_5}")
    if(tessera_since_tag)
      string(APPEND tessera_package_version "+${tessera_since_tag}.g${tessera_commit}")
    endif()
    if(tessera_dirty AND tessera_since_tag)
      string(APPEND tessera_package_version ".dirty")
    elseif(tessera_dirty)
      string(APPEND tessera_package_version "+dirty")
    endif()
  else()
    if(tessera_described)
      message(WARNING "package: the tag in `git describe` (${tessera_described}) is no version; "
                      "the package is named from the project's version and the commit")
    endif()
    tessera_git(tessera_count rev-list --count HEAD)
    tessera_git(tessera_commit describe --always --dirty --abbrev=7 --exclude=*)
    string(REPLACE "-" "." tessera_commit "${tessera_commit}")
    set(tessera_package_version "${CPACK_TESSERA_PROJECT_VERSION}+${tessera_count}.g${tessera_commit}")
  endif()
endif()
message(STATUS "package: version ${tessera_package_version}")
set(CPACK_PACKAGE_VERSION "${tessera_package_version}")
set(CPACK_DEBIAN_PACKAGE_VERSION "${tessera_package_version}")
