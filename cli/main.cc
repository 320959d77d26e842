#include "cli/app.h"

int main(int argc, char** argv) {
  return kwatch::cli::Main(argc, argv);
}
