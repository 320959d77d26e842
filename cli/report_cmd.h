#pragma once

#include <string>
#include <vector>

namespace kwatch::cli {

// `kwatch report FILE [...]`: the storage profile (and probe hits) of a recording. `args`
// are the arguments after "report". Returns the exit status (0, 1 error, 2 usage).
int ReportMain(const std::vector<std::string>& args);

// `kwatch export --sql OUT FILE`: a copy of recording FILE with one row per event in table
// `events` (docs/recording.md), for sqlite3. `args` are the arguments after "export".
int ExportMain(const std::vector<std::string>& args);

}  // namespace kwatch::cli
