#pragma once

namespace kwatch::gui {

// kwatch-gui's main:
//   kwatch-gui [--follow] [FILE.kwdb]
//   kwatch-gui [--size WxH] --export-png OUT.png|--export-svg OUT.svg FILE.kwdb
// The export form runs headless (offscreen unless QT_QPA_PLATFORM says otherwise), writes the
// window as it would show the recording, and exits: 0 on success, 1 with a message on stderr
// when the recording cannot be opened or the picture cannot be written, 2 for bad usage.
int GuiMain(int argc, char** argv);

}  // namespace kwatch::gui
