// One lock for every HDF5 call in the program. Debian's libhdf5 is built without thread safety,
// and tessera calls it from several threads (extract's reader creates a feature file while its
// writer appends to another; the loader reads patch files on its workers). Recursive, so a
// function that holds it may call another that takes it.
#pragma once
#include <mutex>

namespace tessera {

class Hdf5Lock {
 public:
  Hdf5Lock();
  ~Hdf5Lock();
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> hold_;
};

}  // namespace tessera
