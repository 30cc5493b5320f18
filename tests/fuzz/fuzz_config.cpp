// libFuzzer target: any bytes handed to convnn as a JSON config (--config). A c10::Error is the
// reader's refusal; anything else (a crash, a sanitizer report, another exception, a hang, an
// allocation past libFuzzer's RSS limit) is a finding.
#include "convnn/config/train_config.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& path = convnn::fuzz::write_input(data, size, ".json");
  try {
    convnn::train::validate(convnn::train::read_config(path));
  } catch (const c10::Error&) {
  }
  return 0;
}
