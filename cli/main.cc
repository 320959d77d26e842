#include <string>
#include <vector>

#include "cli/app.h"
#include "cli/gdbserver_cmd.h"
#include "cli/probe_cmd.h"
#include "cli/slots_cmd.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "probe") {
    return kwatch::cli::ProbeMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (argc > 1 && std::string(argv[1]) == "gdbserver") {
    return kwatch::cli::GdbServerMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (argc > 1 && std::string(argv[1]) == "slots") {
    return kwatch::cli::SlotsMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  return kwatch::cli::Main(argc, argv);
}
