# The headers most of tessera's translation units parse: the standard library's common ones,
# nlohmann/json (through compute/op.h), Vulkan, and per target CLI11 or GoogleTest. Compiled once a
# target instead of once a file, they take a fifth off a clean build on CI's two cores (CLI11 alone
# is 7 s a file). TESSERA_PRECOMPILED_HEADERS=OFF builds without them, which is how to check that
# each file includes what it uses.
option(TESSERA_PRECOMPILED_HEADERS "Precompile the common headers of each target" ON)
set(tessera_common_headers <algorithm> <array> <chrono> <cmath> <cstdint> <cstdio> <cstring> <filesystem>
  <fstream> <functional> <map> <memory> <optional> <set> <span> <string> <vector> <nlohmann/json.hpp>
  <vulkan/vulkan.h>)

# tessera_precompile(TARGET [HEADER...]): the common headers and these for TARGET's files.
function(tessera_precompile target)
  if(TESSERA_PRECOMPILED_HEADERS)
    target_precompile_headers(${target} PRIVATE ${tessera_common_headers} ${ARGN})
  endif()
endfunction()

# tessera_precompile_like(TARGET OWNER): TARGET's files use OWNER's precompiled headers (the same
# compile flags: the test executables share the test support library's).
function(tessera_precompile_like target owner)
  if(TESSERA_PRECOMPILED_HEADERS)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endif()
endfunction()
