// Compiled (not run) by ctest with -DKERNEL=<name>: a kernel is a generated constant, so a name
// that no shader in shaders/ has does not compile.
#include "compute/vk/kernel_names.h"

const tessera::vk::KernelSource& kernel = tessera::vk::kernel::KERNEL;
