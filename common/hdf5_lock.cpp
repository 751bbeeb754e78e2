#include "common/hdf5_lock.h"

namespace tessera {

namespace {
std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}
}  // namespace

Hdf5Lock::Hdf5Lock() : hold_(hdf5_mutex()) {}
Hdf5Lock::~Hdf5Lock() = default;

}  // namespace tessera
