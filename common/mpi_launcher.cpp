#include "common/mpi_launcher.h"

namespace tessera {

const std::vector<std::string>& mpi_launcher_variables() {
  static const std::vector<std::string> variables{"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
  return variables;
}

}  // namespace tessera
