// spec/spec.h: job specs, as `dgca submit` and SubmitJob hand
// them to the coordinator.
#include "spec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = dgca::ParseJobSpec(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (r.ok()) (void)dgca::FormatProblems(r->problems);
  return 0;
}
