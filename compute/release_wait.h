// TESSERA_FAULT=wait:DIR, for tests that must act while a trial runs (kill its sweep, start
// another worker) without depending on timing: the trial writes DIR/started-N (N is
// $TESSERA_TRIAL, which the sweep sets) and waits until DIR/go-N exists.
#pragma once
#include <string>

namespace tessera {

void wait_for_release(const std::string& directory);

}  // namespace tessera
