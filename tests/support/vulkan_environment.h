// One Vulkan context shared by the tests of an executable; the run fails if the validation
// layer reported anything.
#pragma once
#include "compute/vk/context.h"

namespace tessera::test {

vk::Context& context();

}  // namespace tessera::test
