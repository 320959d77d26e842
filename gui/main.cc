#include "gui/gui_main.h"

int main(int argc, char** argv) {
  return kwatch::gui::GuiMain(argc, argv);
}
