// Compiled (not run) by ctest with -DKERNEL=<name>: a kernel is a generated constant, so a name
// that no shader in shaders/ has does not compile.
#include "compute/vk/kernel_names.h"

const auto& kernel = tessera::vk::kernel::KERNEL;  // a KernelSource, ActivationKernel or OperandKernel
