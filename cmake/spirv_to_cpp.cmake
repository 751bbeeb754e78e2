# Turns one .spv file into a C++ source holding its 32-bit words.
file(READ ${SPV} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR word_count "${hex_length} / 8")
set(words "")
set(i 0)
while(i LESS hex_length)
  # SPIR-V is little-endian: bytes b0 b1 b2 b3 make the word 0xb3b2b1b0.
  string(SUBSTRING "${hex}" ${i} 8 w)
  string(SUBSTRING "${w}" 0 2 b0)
  string(SUBSTRING "${w}" 2 2 b1)
  string(SUBSTRING "${w}" 4 2 b2)
  string(SUBSTRING "${w}" 6 2 b3)
  string(APPEND words "0x${b3}${b2}${b1}${b0},")
  math(EXPR i "${i} + 8")
  math(EXPR line_break "${i} % 64")
  if(line_break EQUAL 0)
    string(APPEND words "\n")
  endif()
endwhile()
file(WRITE ${CPP} "// Generated from ${NAME}.spv by cmake/spirv_to_cpp.cmake.
#include \"compute/vk/kernel_source.h\"
namespace tessera::vk {
static const uint32_t words[${word_count}] = {
${words}};
extern const ShaderBinary shader_${NAME};
const ShaderBinary shader_${NAME}{words, ${word_count}};
}  // namespace tessera::vk
")
