#include "common/error.h"

namespace tessera {

int exit_code_of(const std::exception& e) {
  if (auto* error = dynamic_cast<const Error*>(&e)) return static_cast<int>(error->code());
  return static_cast<int>(ExitCode::runtime_error);
}

}  // namespace tessera
