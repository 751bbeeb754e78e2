// The version of this build: `git describe --tags --dirty` of the source tree when it was built,
// "<project version>+g<commit>" in a checkout without tags, the project version outside git
// (cmake/version.cmake).
#pragma once

namespace tessera {

const char* version();
// The commit it was built from (`git rev-parse HEAD`), "unknown" outside git.
const char* commit();

}  // namespace tessera
